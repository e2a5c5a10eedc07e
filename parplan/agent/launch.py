"""Start the ranks of a run with torchrun's elastic launcher and collect what they report.

:func:`launch` starts ``nprocs`` worker processes on this machine through
``torch.distributed.launcher.api.elastic_launch`` (the API behind ``torchrun``), with a c10d
rendezvous on a free local port; each worker initialises the default process group (gloo on the
CPU, NCCL on GPUs), runs every :class:`~parplan.agent.run_spec.RunSpec` in turn and returns its
reports. Several specs share one launch so that the process start-up (importing torch, the
rendezvous) is paid once.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from parplan.agent.run_spec import RunSpec

log = logging.getLogger(__name__)

#: Set (to anything) to let ranks outnumber the CUDA devices: they share them and talk through gloo.
SHARE_GPUS_ENV = "PARPLAN_AGENT_SHARE_GPUS"

#: Seconds a collective may wait before a rank gives up (a failed peer otherwise hangs it).
COLLECTIVE_TIMEOUT_S = 300


class LaunchError(RuntimeError):
    """The worker processes failed; the message carries the first rank's traceback."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@record
def _entry(fn: Callable[..., Any], args: tuple[Any, ...], device_kind: str) -> Any:
    """One rank: initialise the default process group (gloo on the CPU, NCCL on GPUs), call
    ``fn(*args)``, tear the group down."""
    import torch
    import torch.distributed as dist

    from parplan.agent.executor import device_for_rank

    os.environ["PARPLAN_AGENT_DEVICE"] = device_kind
    world = int(os.environ["WORLD_SIZE"])
    device = device_for_rank()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # NCCL refuses two ranks on one GPU: ranks that share GPUs (allowed by SHARE_GPUS_ENV) talk
        # through gloo, which keeps device buffers of its own; their memory and step times are no
        # measurement of a real run
        backend = "gloo" if shares_gpus() else "nccl"
    else:
        backend = "gloo"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            device_id=device if backend == "nccl" else None)
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def shares_gpus() -> bool:
    """Whether this machine's ranks outnumber its CUDA devices (several ranks per GPU)."""
    import torch

    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > max(1, torch.cuda.device_count())


def run_specs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every spec in turn on this rank; one report per spec."""
    import torch.distributed as dist

    from parplan.agent.executor import device_for_rank, run_spec

    device = device_for_rank()
    reports = []
    for d in specs:
        reports.append(run_spec(RunSpec.from_dict(d), device))
        dist.barrier()
    return reports


def launch_function(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int, device_kind: str = "cpu",
                    rdzv_timeout_s: int = 120) -> list[Any]:
    """Call ``fn(*args)`` on ``nprocs`` local ranks of one process group; per-rank results.
    ``fn`` must be importable (a module-level function): the workers are spawned."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if device_kind == "cuda" and nprocs > torch.cuda.device_count() and not os.environ.get(SHARE_GPUS_ENV):
        raise LaunchError(f"{nprocs} ranks need {nprocs} GPUs; this machine has {torch.cuda.device_count()} "
                          f"(NCCL runs one rank per GPU; {SHARE_GPUS_ENV}=1 lets ranks share GPUs through gloo, "
                          "whose buffers on the GPU differ from NCCL's: no measurement of a real run)")

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"parplan-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0,
        monitor_interval=0.1, start_method="spawn", rdzv_configs={"timeout": rdzv_timeout_s},
    )
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
    log.info("launching %d %s processes for %s", nprocs, device_kind, getattr(fn, "__name__", fn))
    try:
        results = elastic_launch(config, _entry)(fn, args, device_kind)
    except ChildFailedError as e:
        raise LaunchError(_failure_message(e)) from None
    except Exception as e:  # rendezvous and start-up failures
        raise LaunchError(f"launch failed: {e}\n{traceback.format_exc(limit=3)}") from None
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return [results[r] for r in sorted(results)]


def launch(specs: list[RunSpec], nprocs: int, device_kind: str = "cpu") -> list[list[dict[str, Any]]]:
    """Run ``specs`` on ``nprocs`` local processes; one list of per-rank reports per spec
    (sorted by rank). :class:`LaunchError` if any rank failed."""
    for s in specs:
        if s.world != nprocs:
            raise ValueError(f"spec {s.label or s} needs {s.world} ranks, launching {nprocs}")
    per_rank = launch_function(run_specs, ([s.to_dict() for s in specs],), nprocs, device_kind)
    return [[per_rank[r][i] for r in range(nprocs)] for i in range(len(specs))]


def _failure_message(e: Any) -> str:
    failures = getattr(e, "failures", {}) or {}
    parts = []
    for rank in sorted(failures):
        f = failures[rank]
        msg = getattr(f, "message", "") or ""
        if isinstance(msg, dict):
            msg = msg.get("message", "") or str(msg)
        parts.append(f"rank {rank}: {str(msg).strip()[-4000:]}")
    return "worker processes failed:\n" + ("\n".join(parts) if parts else str(e))
