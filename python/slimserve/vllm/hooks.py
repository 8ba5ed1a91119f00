"""Where the tag guard reaches into vLLM (0.32) beyond the attention-backend interface. All
three are internal to vLLM (docs/vllm.md lists them); each is installed once per process,
wraps the original method and calls it unchanged when no slimserve guard is active.

  worker  GPUModelRunner._update_states(scheduler_output): the guard applies the step's block
          deltas first (guard.BlockGuard.observe); the runner is remembered so the metadata
          builder can name its rows (input_batch.req_ids).
  worker  GPUModelRunner.sample_tokens(...) -> ModelRunnerOutput: the guard reads the step's
          verdicts back; an aborted request's sampled tokens are dropped and the output
          carries `slimserve_aborted` {request id: reason}.
  engine  Scheduler.update_from_output(scheduler_output, model_runner_output): the aborted
          requests are put among the requests vLLM finishes with an error in this update
          (RequestStatus.FINISHED_ERROR, FinishReason.ERROR: the client's output ends with
          finish_reason "error"), their blocks freed by vLLM as for any finished request."""
from __future__ import annotations

from . import guard as _guard
from . import stats

_INSTALLED = set()
RUNNER = {"runner": None}


def install_worker_hooks() -> None:
    if "worker" in _INSTALLED:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    update_states = GPUModelRunner._update_states
    sample_tokens = GPUModelRunner.sample_tokens

    def _update_states_guarded(self, scheduler_output, *args, **kwargs):
        g = _guard.ACTIVE["guard"]
        if g is not None:
            RUNNER["runner"] = self
            _watch_connector(g)
            g.observe(scheduler_output)
        return update_states(self, scheduler_output, *args, **kwargs)

    def _sample_tokens_guarded(self, *args, **kwargs):
        output = sample_tokens(self, *args, **kwargs)
        g = _guard.ACTIVE["guard"]
        if g is not None and output is not None and hasattr(output, "req_id_to_index"):
            aborted = g.verdicts()
            g.rows = []
            if aborted:
                for req_id in aborted:
                    index = output.req_id_to_index.get(req_id)
                    if index is not None and index < len(output.sampled_token_ids):
                        output.sampled_token_ids[index] = []  # the token its NaN logits gave
                output.slimserve_aborted = aborted
        return output

    GPUModelRunner._update_states = _update_states_guarded
    GPUModelRunner.sample_tokens = _sample_tokens_guarded
    _INSTALLED.add("worker")


def _watch_connector(g) -> None:
    """With a KV connector (disaggregated prefill), its per-step transfer results tell the
    guard which requests' received blocks are written: the worker's connector object's
    get_transfer_results is wrapped once (vLLM's model runner calls it every step)."""
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    except ImportError:
        return
    if not has_kv_transfer_group():
        return
    connector = get_kv_transfer_group()
    if getattr(connector, "_slimserve_watched", None) is g:
        return
    results = type(connector).get_transfer_results

    def _get_transfer_results_watched(*args, **kwargs):
        out = results(connector, *args, **kwargs)
        current = _guard.ACTIVE["guard"]
        if current is not None:
            current.transfers_done(getattr(out, "finished_recving", None))
        return out

    connector.get_transfer_results = _get_transfer_results_watched
    connector._slimserve_watched = g


def install_engine_hooks() -> None:
    if "engine" in _INSTALLED:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    update_from_output = Scheduler.update_from_output

    def _update_from_output_guarded(self, scheduler_output, model_runner_output, *args, **kwargs):
        aborted = getattr(model_runner_output, "slimserve_aborted", None)
        if aborted:
            errors = getattr(self, "grammar_compile_error_reqs", None)
            if not isinstance(errors, set):
                raise RuntimeError("slimserve vLLM guard: this vLLM's scheduler has no set of requests to "
                                   "finish with an error (grammar_compile_error_reqs); cannot abort "
                                   f"{sorted(aborted)}")
            errors.update(req_id for req_id in aborted if req_id in self.requests)
            stats.count("guard_aborts_reported", len(aborted))
        return update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs)

    Scheduler.update_from_output = _update_from_output_guarded
    _INSTALLED.add("engine")


def current_req_ids():
    """The worker's rows in batch order (what the block table's rows are)."""
    runner = RUNNER["runner"]
    return None if runner is None else runner.input_batch.req_ids
