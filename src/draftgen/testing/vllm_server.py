"""A real `vllm serve` (vLLM for CPU, built by scripts/build_vllm.sh) started and stopped around a
test, a benchmark or an example, on loopback:

    with VLLMServer(log_path=tmp / "vllm.log") as server:
        ... server.url, server.served_name ...

The settings are the ones that give the same greedy answers whatever the batch (float32, eager:
bf16 gave different answers at concurrency 1 and 8), on one pinned core (`cpu`, default "0";
the KV cache is 2 GiB: ~5 GB resident in all). Started in its own session (vLLM's engine and
worker processes with it) and stopped as a group: SIGTERM, then SIGKILL after `stop_timeout_s`;
on Linux the server also gets SIGTERM if the process that started it dies without stopping it.
A server that exits, or is not ready (`GET /health` 200) within `startup_timeout_s`, raises
VLLMStartError with its log's tail. Never used by a production run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from draftgen.assets import VLLM_BUILD_HINT, find_smollm2_hf, find_vllm
from draftgen.backends.managed_llamacpp import _pdeathsig_hook, _signal_group, free_port, tail
from draftgen.errors import DraftgenError

SERVED_NAME = "smollm2-135m-instruct"
EXACT_ARGS = ("--dtype", "float32", "--enforce-eager", "--generation-config", "vllm")
"""float32 and eager: the same greedy IDs at any batch size. `--generation-config vllm`: the
request's sampling only, not defaults from the model folder's generation_config.json."""


HIDDEN_STATE_LAYERS = (2, 15, 27, 30)
"""speculators' EAGLE-3 layers for SmolLM2's 30 (2, n/2, n-3) and the last one."""


def hidden_state_args(staging: Path, layers: Sequence[int] = HIDDEN_STATE_LAYERS) -> list[str]:
    """`vllm serve` arguments for hidden-state extraction (the `extract_hidden_states`
    speculative method, vLLM's example connector writing each request's states under
    STAGING): what `speculators generate-offline-data` reads."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
                                                 list(layers)}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(staging)}}
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--no-enable-chunked-prefill", "--no-enable-prefix-caching"]


class VLLMStartError(DraftgenError):
    """`vllm serve` exited or was not ready in time (the message has its log's tail)."""


class VLLMServer:
    def __init__(self, log_path: Path, *, model: Path | None = None,
                 served_name: str = SERVED_NAME, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cpu: str | None = None,
                 max_model_len: int = 4096, startup_timeout_s: float = 900,
                 stop_timeout_s: float = 30) -> None:
        vllm, found_model = find_vllm(), find_smollm2_hf()
        if vllm is None or (model is None and found_model is None):
            raise VLLMStartError(f"vLLM or its SmolLM2 folder is missing; {VLLM_BUILD_HINT}")
        self.vllm = vllm
        self.model = model or found_model
        self.log_path = log_path
        self.served_name = served_name
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.cpu = cpu or os.environ.get("DRAFTGEN_VLLM_CPU", "0")
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.started_s = 0.0
        """Seconds from the start to the first healthy answer."""

    def command(self, port: int) -> list[str]:
        return [str(self.vllm), "serve", str(self.model), "--host", "127.0.0.1",
                "--port", str(port), "--served-model-name", self.served_name,
                "--max-model-len", str(self.max_model_len), *EXACT_ARGS, *self.extra_args]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CPU_OMP_THREADS_BIND": self.cpu, "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_LOGGING_LEVEL": "WARNING", **self.env}

    def start(self) -> str:
        port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(port), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True,
                preexec_fn=_pdeathsig_hook())
        url = f"http://127.0.0.1:{port}"
        try:
            self._wait_ready(url)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - t0
        self.url = url
        return url

    def _wait_ready(self, url: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VLLMStartError(f"vllm serve exited with {self.proc.returncode}; "
                                     f"{self.log_path}:\n{tail(self.log_path)}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        raise VLLMStartError(f"vllm serve not ready after {self.startup_timeout_s:.0f} s; "
                             f"{self.log_path}:\n{tail(self.log_path)}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        # the engine and worker processes, should any outlive the API server
        _signal_group(proc.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

