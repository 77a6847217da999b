from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# The tiers whose fixtures bring up a control plane, a real node or kind, and build images: their
# first test's setup can take many minutes, so they get longer than pyproject's per-test 600 s.
LONG_TIERS = ("cluster", "node", "e2e")
LONG_TIER_TIMEOUT_S = 2400


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 -- any failure to probe CUDA means no GPU tier
        return False


def pytest_itemcollected(item: pytest.Item) -> None:
    """`@pytest.mark.fast_cases(id, ...)` on a parametrised test: the cases (pytest's ids) that
    `make test-fast` runs, chosen so that every branch the grid exercises is still taken there
    once; the test's other cases are `slow`, for `make test`."""
    fast = item.get_closest_marker("fast_cases")
    callspec = getattr(item, "callspec", None)
    if fast is not None and callspec is not None and callspec.id not in fast.args:
        item.add_marker(pytest.mark.slow)


def _check_fast_cases(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each case a `fast_cases` mark names is one of its test's cases: a renamed parameter fails
    the collection instead of leaving its test with no case in `make test-fast`. (Before -k and
    -m deselect anything; a case named alone on the command line comes without its grid.)"""
    if any("::" in a for a in config.args):
        return
    named: dict[str, set[str]] = {}
    ids: dict[str, set[str]] = {}
    for item in items:
        fast = item.get_closest_marker("fast_cases")
        callspec = getattr(item, "callspec", None)
        if fast is not None and callspec is not None:
            test = item.nodeid.split("[")[0]
            named.setdefault(test, set()).update(fast.args)
            ids.setdefault(test, set()).add(callspec.id)
    for test, want in named.items():
        if want - ids[test]:
            raise pytest.UsageError(f"{test}: fast_cases names no such case "
                                    f"{sorted(want - ids[test])}; its cases: {sorted(ids[test])}")


@pytest.hookimpl(tryfirst=True)  # (fast_cases checked before -k and -m deselect)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_fast_cases(config, items)
    no_gpu = pytest.mark.skip(reason="needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    no_kind = pytest.mark.skip(reason="needs `docker` and `kind` on PATH (run `make e2e`)")
    has_cuda = _has_cuda()
    has_kind = shutil.which("docker") is not None and shutil.which("kind") is not None
    no_pods = None
    if not has_kind and any(item.get_closest_marker("node") for item in items):
        from tests.e2e.local_cluster import unavailable_reason

        why = unavailable_reason()
        if why:
            no_pods = pytest.mark.skip(reason=f"real pods need kind (`docker` and `kind` on PATH) "
                                       f"or the real node of `make cluster` ({why})")
    for item in items:
        if item.get_closest_marker("timeout") is None and any(
                item.get_closest_marker(m) for m in LONG_TIERS):
            item.add_marker(pytest.mark.timeout(LONG_TIER_TIMEOUT_S))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(no_gpu)
        if item.get_closest_marker("node"):  # the real-pod suite: kind, or the local real node
            if no_pods is not None:
                item.add_marker(no_pods)
        elif "e2e" in item.keywords and not has_kind:
            item.add_marker(no_kind)


@pytest.fixture(scope="session")
def multimodal_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """A tiny checkpoint of every multimodal architecture in every layout (`MULTIMODAL_CASES`)."""
    from radixserve.testing import MULTIMODAL_CASES, write_tiny_multimodal_checkpoint

    root = tmp_path_factory.mktemp("multimodal")
    return {(a, layout): write_tiny_multimodal_checkpoint(a, root / f"{a}-{layout}", layout=layout)
            for a, layout in MULTIMODAL_CASES}


_xdist_worker = False  # this process's, set by pytest_configure for the report hook


def pytest_configure(config: pytest.Config) -> None:
    global _xdist_worker
    _xdist_worker = hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With RADIXSERVE_TEST_TIMES=FILE, one line per test phase as it ends (seconds, outcome, id,
    and a failure's message): a run cut short by a time limit (the GPU machine's 10-minute call)
    still says where its time went and why a test failed, which pytest only prints at the end.
    Under pytest-xdist the controller writes it (a worker's report reaches it as it ends). A
    worker is told by its config, not by PYTEST_XDIST_WORKER, which a pytest started from inside
    a worker (pytester) inherits."""
    import os

    path = os.environ.get("RADIXSERVE_TEST_TIMES")
    if not path or _xdist_worker:
        return
    if report.when == "call" or report.outcome != "passed":
        crash = getattr(report.longrepr, "reprcrash", None) if report.failed else None
        why = f" | {crash.message.splitlines()[0][:300]}" if crash is not None else ""
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.outcome:7} {report.when:8} {report.nodeid}{why}\n")
