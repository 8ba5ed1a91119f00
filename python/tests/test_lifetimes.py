"""Native objects are destroyed dependents first (the C ABI's rule: a pool outlives its prefix
cache and page sets), also when the garbage collector finalizes them in another order."""
import gc

import slimserve as ss


class _RecordingLibrary:
    """Forwards to the C library and records the destroy calls of the handles it is told to
    watch, in order (other tests' garbage may be collected meanwhile)."""

    def __init__(self, lib):
        self._lib, self.destroyed, self.watched = lib, [], set()

    def watch(self, *objects):
        self.watched.update(o._handle.value for o in objects)

    def __getattr__(self, name):
        function = getattr(self._lib, name)
        if not name.endswith("_destroy"):
            return function

        def destroy(handle):
            if getattr(handle, "value", handle) in self.watched:
                self.destroyed.append(name)
            return function(handle)
        return destroy


def test_pool_finalized_first_waits_for_its_dependents(monkeypatch):
    recorder = _RecordingLibrary(ss._lib)
    monkeypatch.setattr(ss, "_lib", recorder)
    pool = ss.PagePool(8)
    cache = ss.PrefixCache(pool, 16)
    sets = ss.RequestSets(pool, cache, 4, 16)
    recorder.watch(pool, cache, sets)
    # What the collector does with a cycle: it clears weak references, then finalizes in any
    # order; here the pool first, then the cache, then the page sets.
    pool._dependents.clear()
    cache._dependents.clear()
    pool.close()
    cache.close()
    assert recorder.destroyed == []  # both wait: the page sets still use them
    sets.close()
    assert recorder.destroyed == ["slimserve_request_sets_destroy", "slimserve_prefix_cache_destroy",
                                  "slimserve_page_pool_destroy"]


def test_explicit_close_and_cycles_destroy_each_once(monkeypatch):
    recorder = _RecordingLibrary(ss._lib)
    monkeypatch.setattr(ss, "_lib", recorder)
    pool = ss.PagePool(8)
    cache = ss.PrefixCache(pool, 16)
    recorder.watch(pool, cache)
    pool.close()  # closes the cache first
    assert recorder.destroyed == ["slimserve_prefix_cache_destroy", "slimserve_page_pool_destroy"]
    cache.close()
    pool = ss.PagePool(8)
    cache = ss.PrefixCache(pool, 16)
    recorder.watch(pool, cache)
    cache.cycle = cache
    del pool, cache
    gc.collect()
    assert recorder.destroyed[2:] == ["slimserve_prefix_cache_destroy", "slimserve_page_pool_destroy"]


def test_objects_alive_at_interpreter_exit_are_left_to_the_process(tmp_path):
    # At exit Python clears each module's names, those starting with "_" first: an object that
    # only the module's other names still hold is finalized after `_lib` became None, and a
    # finalizer that reaches a global then raises ("Exception ignored in ..."). Every native
    # object left alive that way must exit quietly.
    import subprocess
    import sys
    script = tmp_path / "exit_with_objects_alive.py"
    script.write_text(
        "import numpy as np\n"
        "import slimserve as ss\n"
        "pool = ss.PagePool(8)\n"
        "cache = ss.PrefixCache(pool, 16)\n"
        "sets = ss.RequestSets(pool, cache, 4, 16)\n"
        "table = ss.PageTable(4, 8, 16, 8)\n"
        "tags = ss.DeviceTags(8)\n"
        "weights = ss.quantize_int4(np.random.default_rng().standard_normal((64, 32), np.float32), group_size=32)\n"
        "ss.kept_until_exit = [pool, cache, sets, table, tags, weights]\n"
        "del pool, cache, sets, table, tags, weights\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
