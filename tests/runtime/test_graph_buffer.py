"""The decode graphs' static inputs (`GraphCaptureBuffer`): a step staged from host lists in one
copy, and a batch built on the device and copied in, both give the graph of the padded size the
requests' rows, positions and lengths, padding requests after them, and (gathered as the graph
does) each request's input token and KV slot. The layout depends on the padded size, so sizes are
staged one after another into the same buffer. And the runner: a staged step replays the graph
of its padded size over what it staged, a batch built on the device is copied in instead. Runs on
CPU, the "graphs" rerunning the captured function; real replays are the GPU tier's
(tests/gpu/test_graphs_overlap.py)."""
from __future__ import annotations

import functools
import random

import torch

from radixserve.core.request import Req
from radixserve.core.table import TableManager
from radixserve.engine.batch_builder import build_batch
from radixserve.engine.cuda_graph import GraphCaptureBuffer
from radixserve.sampling_params import SamplingParams

ROWS, COLS, DUMMY = 10, 64, 9999


def _table() -> tuple[TableManager, int]:
    table = TableManager(ROWS, COLS, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    table.token_pool.copy_(torch.randint(0, 50_000, table.token_pool.shape, generator=gen))
    table.page_table.copy_(torch.randperm(ROWS * COLS, generator=gen).view(ROWS, COLS).int())
    padding_row = ROWS - 1
    table.page_table[padding_row].fill_(DUMMY)  # as the engine does
    return table, padding_row


def _check(batch, table: TableManager, rows: list[int], starts: list[int], padded: int,
           padding_row: int) -> None:
    pad = padded - len(rows)
    want_rows = rows + [padding_row] * pad
    want_pos = starts + [0] * pad
    assert batch.bs == padded
    assert batch.req_rows.tolist() == want_rows
    assert batch.positions.tolist() == want_pos
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu == [p + 1 for p in starts] + [1] * pad
    assert batch.seq_lens.dtype == torch.int32 and batch.req_rows.dtype == torch.int64
    assert batch.extend_lens.tolist() == batch.extend_lens_cpu == [1] * padded
    assert batch.input_ids.tolist() == [table.token_pool[r, p].item()
                                        for r, p in zip(want_rows, want_pos)]
    assert batch.out_loc.tolist() == [table.page_table[r, p].item() for r, p in zip(rows, starts)] \
        + [DUMMY] * pad


def test_staged_and_copied_batches_give_the_graph_the_same_padded_inputs() -> None:
    table, padding_row = _table()
    buf = GraphCaptureBuffer.create(16, table.token_pool, table.page_table, padding_row)
    rng = random.Random(0)
    for n, padded in [(5, 8), (16, 16), (1, 1), (3, 4), (9, 16), (2, 8)]:
        rows = [rng.randrange(ROWS - 1) for _ in range(n)]  # (the buffer allows a row twice)
        starts = [rng.randint(0, COLS - 2) for _ in rows]

        staged = buf.load_lists(rows, starts, padded)
        buf.gather(staged)  # what the replay does first
        _check(staged, table, rows, starts, padded, padding_row)

        buf.load_lists([], [], 16)  # scribble over every layout before the copied batch
        items = [(Req(i, [1] * (s + 3), SamplingParams(), row=r, kv_len=s), 1)
                 for i, (r, s) in enumerate(zip(rows, starts))]
        copied = buf.load(build_batch(items, table, torch.device("cpu"), True), padded)
        buf.gather(copied)
        _check(copied, table, rows, starts, padded, padding_row)


def test_a_fresh_capture_size_reads_only_padding_requests() -> None:
    """What each graph is captured on: every request reads the padding row's first token and
    writes the scratch slot, whatever the buffer held for another size before."""
    table, padding_row = _table()
    buf = GraphCaptureBuffer.create(16, table.token_pool, table.page_table, padding_row)
    buf.load_lists([3, 4, 5], [60, 61, 62], 16)
    for padded in (16, 8, 4, 2, 1):
        batch = buf.load_lists([], [], padded)
        buf.gather(batch)
        _check(batch, table, [], [], padded, padding_row)


class _Recorder:
    """An attention backend's graph hooks: records the batch each replay was prepared with."""

    FUSES_UP_TO = 4  # decode batches it would fuse the new token's store into (`fuses_rope_at`)

    def __init__(self) -> None:
        self.replays: list = []
        self.captured: list = []  # (size, a verification step's) of each capture
        self.graphs_replayed: list = []  # (size, a verification step's) of each graph replayed

    def fuses_rope_at(self, bs: int) -> bool:
        return bs <= self.FUSES_UP_TO

    def init_cuda_graph(self, max_bs: int) -> None:
        pass

    def prepare_for_capture(self, batch) -> None:
        self.captured.append((batch.bs, batch.verify))

    def prepare_for_replay(self, batch) -> None:
        self.replays.append(batch)

    def warm_up_eager_decode(self, sizes: list[int]) -> None:
        pass


def _eager_runner(monkeypatch, table: TableManager, padding_row: int, max_bs: int,
                  verify: bool = False):
    """A `CudaGraphRunner` whose "graphs" rerun the captured function eagerly on replay (CPU),
    writing into the tensor the capture returned, as a replay does."""
    from radixserve.engine import cuda_graph

    class EagerGraph:
        def __init__(self, fn, out: torch.Tensor, backend, key) -> None:
            self.fn, self.out, self.backend, self.key = fn, out, backend, key

        @torch.inference_mode()  # (as the capture ran)
        def replay(self) -> None:
            self.backend.graphs_replayed.append(self.key)
            self.out.copy_(self.fn())

    def capture(self, batch, forward):
        fn = functools.partial(self._forward, batch, forward)
        out = fn()
        return EagerGraph(fn, out, self.attn_backend, (batch.bs, batch.verify)), out

    monkeypatch.setattr(cuda_graph.CudaGraphRunner, "_capture", capture)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _NoStream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    # the "logits" of each row: its token id, position, KV slot and length, as the graph read them
    def forward(b):
        return torch.stack([b.input_ids, b.positions, b.out_loc, b.seq_lens.long()], 1)

    buf = GraphCaptureBuffer.create(max_bs, table.token_pool, table.page_table, padding_row)
    backend = _Recorder()
    return cuda_graph.CudaGraphRunner(forward, backend, buf, verify=verify), backend


class _NoStream:
    def wait_stream(self, stream) -> None:
        pass


def test_a_staged_step_replays_its_padded_graph_on_the_rows_it_was_staged_with(monkeypatch) -> None:
    table, padding_row = _table()
    runner, backend = _eager_runner(monkeypatch, table, padding_row, 16)
    rows, starts = [4, 1, 7], [10, 0, 33]
    batch = runner.stage(rows, starts)
    assert batch.bs == 3 and batch.seq_lens_cpu == [11, 1, 34]
    out = runner.run(batch)
    want = [[table.token_pool[r, p].item(), p, table.page_table[r, p].item(), p + 1]
            for r, p in zip(rows, starts)]
    assert out.tolist() == want
    assert backend.replays[-1].bs == 4  # the graph of the next captured size
    # after the replay the batch the scheduler holds reads the step's own tokens and slots
    assert batch.input_ids.tolist() == [w[0] for w in want]
    assert batch.out_loc.tolist() == [w[2] for w in want]

    # a batch built on the device is copied in (not mistaken for the staged one)
    runner.stage([2], [5])
    items = [(Req(i, [1] * (s + 3), SamplingParams(), row=r, kv_len=s), 1)
             for i, (r, s) in enumerate(zip(rows, starts))]
    assert runner.run(build_batch(items, table, torch.device("cpu"), True)).tolist() == want
    assert runner.stage(list(range(17)), [0] * 17) is None  # past the largest graph


def test_verification_rows_replay_graphs_of_their_own_where_the_backend_fuses(monkeypatch) -> None:
    """With verification on, the sizes where the backend fuses the new token's KV store into its
    attention get a graph captured for verification rows (each reads keys the rows before it
    store), the larger sizes share the plain graph; a verification step staged as a request's
    rows, a token each, replays the right one over its positions. Without verification on,
    nothing extra is captured and a verification step finds no graph."""
    table, padding_row = _table()
    runner, backend = _eager_runner(monkeypatch, table, padding_row, 16, verify=True)
    small = [bs for bs in runner.sizes if bs <= _Recorder.FUSES_UP_TO]
    assert sorted(bs for bs, v in backend.captured if v) == small
    assert sorted(bs for bs, v in backend.captured if not v) == runner.sizes
    row, start = 3, 20
    for n in (3, 6):  # its last token and drafts: 3 rows (padded to 4) fuse, 6 (to 8) do not
        assert runner.can_run_verify(n)
        batch = runner.stage([row] * n, [start + j for j in range(n)], verify=True)
        out = runner.run(batch)
        assert out[:, 1].tolist() == list(range(start, start + n))  # each row its position
        assert out[:, 3].tolist() == list(range(start + 1, start + n + 1))  # reads up to it
        assert out[:, 0].tolist() == table.token_pool[row, start: start + n].tolist()
        assert backend.replays[-1].verify
        assert backend.graphs_replayed[-1] == ((4, True) if n == 3 else (8, False))
    graphs = runner.graphs
    assert sorted(graphs[(False, True)]) == small and sorted(graphs[(False, False)]) == runner.sizes

    plain, backend = _eager_runner(monkeypatch, table, padding_row, 16)
    assert not any(v for _, v in backend.captured) and not plain.can_run_verify(3)
    assert plain.stage([row] * 3, [start, start + 1, start + 2], verify=True) is None
