"""Prefill/decode disaggregation inside vLLM: two OpenAI API servers on 127.0.0.1 with vLLM's own
NixlConnector (kv_buffer_device=cpu), slimserve's attention backend and tag guard on both.

For every prompt, the decode server's greedy tokens after a remote prefill must equal what one
server produces alone (the prefill server, asked without kv_transfer_params); the decode server
must have computed only the prompt's last token itself (slimserve's counters: one token per layer
per step, the transferred blocks' tokens never recomputed); both servers' tag guards must have
checked every step and aborted nothing. The servers are multiprocess vLLM (API server and engine
core): with --out-dir the single-server tokens are written as slimserve_auto_mp.json, which
compare.py checks against the in-process run (vLLM's multiprocess mode).

    build/vllm-env/bin/python-vllm tests/vllm/disagg.py --model build/vllm-models/smollm2

Every wait is bounded (server start-up, each request); both servers are killed on exit."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import PROMPTS as ALL_PROMPTS  # noqa: E402  (the in-process runs' prompts)

PROMPTS = ALL_PROMPTS[:3]
STARTUP_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read() or b"null")


class Server:
    """One API server process; its log goes to a file printed when something fails."""

    def __init__(self, name: str, args, kv_cache_dtype: str, log_dir: str):
        self.name = name
        self.port = free_port()
        self.log_path = os.path.join(log_dir, f"{name}.log")
        env = dict(os.environ, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()), VLLM_SERVER_DEV_MODE="1",
                   VLLM_PLUGINS="slimserve")
        transfer = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
                   "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(self.port),
                   "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
                   "--kv-cache-dtype", kv_cache_dtype, "--seed", "0",
                   "--kv-transfer-config", json.dumps(transfer),
                   "--worker-extension-cls", "slimserve.vllm.stats.WorkerStats"]
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)

    def wait_ready(self, deadline: float) -> None:
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.process.returncode} during start-up")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} server not ready after {STARTUP_TIMEOUT_S} s")

    def complete(self, prompt: str, max_tokens: int, kv_transfer_params: dict | None = None) -> dict:
        body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        return post(self.port, "/v1/completions", body)

    def rpc(self, method: str):
        return post(self.port, "/collective_rpc", {"method": method})["results"]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self.log.close()

    def tail(self, lines: int = 60) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (BF16) or fp8_e4m3")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out-dir", help="write the single-server run as slimserve_<kv>_mp.json here")
    args = parser.parse_args()
    start = time.time()
    log_dir = tempfile.mkdtemp(prefix="slimserve-disagg-")
    servers = [Server(name, args, args.kv_cache_dtype, log_dir) for name in ("prefill", "decode")]
    failures: list[str] = []
    try:
        deadline = time.time() + STARTUP_TIMEOUT_S
        for server in servers:
            server.wait_ready(deadline)
        prefill, decode = servers
        startup_s = time.time() - start
        for server in servers:
            server.rpc("slimserve_stats_reset")
        request_start = time.time()
        alone_runs = []
        for prompt in PROMPTS:
            alone = prefill.complete(prompt, args.max_tokens)["choices"][0]
            alone_runs.append({"prompt": prompt, "token_ids": alone["token_ids"]})
            # Step 1: the prefill server computes the prompt (one token) and keeps its blocks for the
            # decode server's NIXL read; its answer carries where they are.
            first = prefill.complete(prompt, 1, {"do_remote_decode": True, "do_remote_prefill": False,
                                                 "remote_engine_id": None, "remote_block_ids": None,
                                                 "remote_host": None, "remote_port": None})
            params = first.get("kv_transfer_params")
            if not params:
                failures.append(f"{prompt!r}: the prefill server returned no kv_transfer_params")
                continue
            # Step 2: the decode server reads those blocks and generates from them.
            remote = decode.complete(prompt, args.max_tokens, params)
            got = remote["choices"][0]
            same = got["token_ids"] == alone["token_ids"]
            print(f"run: {prompt!r}: alone {alone['text']!r} / disaggregated {got['text']!r} "
                  f"({'equal' if same else 'DIFFERENT'}; prompt {remote['usage']['prompt_tokens']} tokens)")
            if not same:
                failures.append(f"{prompt!r}: decode tokens {got['token_ids']} != single server's {alone['token_ids']}")
        request_s = time.time() - request_start
        stats = {server.name: server.rpc("slimserve_stats")[0] for server in servers}
        guard = {server.name: server.rpc("slimserve_guard")[0] for server in servers}
        print(f"run: slimserve counters {json.dumps(stats, sort_keys=True)}")
        print(f"run: guard {json.dumps(guard, sort_keys=True)}")
        layers = decode.rpc("slimserve_kv_cache")[0]["layers"]
        # The decode server computes one token per layer per step: the prompt's last token (its
        # first step, which samples the first token), then one per generated token.
        expected = layers * len(PROMPTS) * args.max_tokens
        if stats["decode"].get("forward_tokens") != expected:
            failures.append(f"decode server: {stats['decode'].get('forward_tokens')} tokens through attention, "
                            f"expected {expected} (only the last prompt token recomputed)")
        for name in ("prefill", "decode"):
            if not stats[name].get("forward"):
                failures.append(f"{name} server: slimserve's forward never ran ({stats[name]})")
            if stats[name].get("guard_aborted", 0):
                failures.append(f"{name} server: the guard aborted {stats[name]['guard_aborted']} requests")
            if not guard[name].get("steps"):
                failures.append(f"{name} server: the tag guard checked no step ({guard[name]})")
        print(f"run: servers up in {startup_s:.0f} s, {len(PROMPTS)} prompts in {request_s:.0f} s")
        if args.out_dir:
            kv = args.kv_cache_dtype
            with open(os.path.join(args.out_dir, f"slimserve_{kv}_mp.json"), "w") as f:
                json.dump({"backend": "slimserve", "kv_cache_dtype": kv, "multiprocess": True,
                           "startup_s": startup_s, "generate_s": request_s, "requests": alone_runs,
                           "stats": [stats["prefill"]]}, f)  # the server that ran them alone
    except Exception as error:  # a failed start-up or request: show both servers' logs
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        for server in servers:
            server.stop()
    if failures:
        for server in servers:
            print(f"--- {server.name} server log (last lines)\n{server.tail()}", file=sys.stderr)
        for failure in failures:
            print(f"disagg: FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"disagg: passed in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
