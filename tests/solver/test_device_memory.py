"""The fit verdict (parplan/solver/device_memory.py): usable memory, reserved peak, and the searches' bound."""

from __future__ import annotations

from parplan.solver.cluster import make_cluster
from parplan.solver.device_memory import allocated_budget_bytes, device_memory, reserved_peak_bytes, verdict
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

MIB = 2**20


def test_usable_memory_of_eight_h100s_by_hand() -> None:
    # CUDA's total on the H100 (measured) 85,017,493,504 B; context 522 MiB; NCCL: 2 communicators x 32
    # channels x (4,194,304 + 4,915,200 + 524,288) B = 616,562,688 B
    dm = device_memory(make_cluster(8, gpu="H100-80GB"))
    assert dm.usable_bytes == 85_017_493_504 - 522 * MIB - 616_562_688
    assert device_memory(make_cluster(1, gpu="H100-80GB")).usable_bytes == 85_017_493_504 - 522 * MIB


def test_reserved_peak_rounds_to_two_mib_and_adds_the_shared_segments() -> None:
    assert reserved_peak_bytes(0) == 22 * MIB
    assert reserved_peak_bytes(1) == 24 * MIB
    assert reserved_peak_bytes(2 * MIB) == 24 * MIB
    assert reserved_peak_bytes(2 * MIB + 0.5) == 26 * MIB


def test_budget_is_exactly_the_largest_allocated_peak_that_fits() -> None:
    for cluster in (make_cluster(8, gpu="H100-80GB"), make_cluster(16, gpu="A100-40GB"),
                    make_cluster(4, gpu="L4", gpu_memory_gib=1.3)):
        budget = allocated_budget_bytes(cluster)
        for a in (budget - 1, budget, budget + 1, budget + 0.5, budget - 2 * MIB, budget + 2 * MIB):
            assert verdict(a, cluster).fits == (a <= budget), (cluster.gpu.name, a, budget)


def test_a_report_says_fits_by_the_reserved_peak() -> None:
    # gpt-1.7b, DP 8 without sharding on 8 devices whose visible memory is set just above the allocated
    # peak: the allocated peak is below the datasheet figure but the reserved peak plus context and NCCL
    # buffers is not
    cfg = get_preset("gpt-1.7b")
    model = ModelSource(cfg.name, config=cfg)
    s = ParallelConfig(dp=8, micro_batch=1, num_microbatches=1)
    peak = evaluate(model, make_cluster(8), s).memory.peak_bytes
    tight = make_cluster(8, gpu_memory_gib=(peak + 100 * MIB) / 2**30)
    e = evaluate(model, tight, s)
    report = e.memory_report()
    assert report.peak_bytes == peak < tight.device_memory_bytes
    assert report.verdict.reserved_peak_bytes > report.verdict.usable_bytes
    assert not e.fits and not report.fits
