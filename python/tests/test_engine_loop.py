import engine_loop


def test_engine_loop_example(rng):
    engine_loop.main(int(rng.integers(0, 2**31)))
