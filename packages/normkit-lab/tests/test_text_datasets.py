"""Byte-level corpora: deterministic content and hash, disjoint splits, windows, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from normkit.errors import SpecError
from normkit_lab.datasets import load_dataset
from normkit_lab.datasets.text import CHUNK_BYTES, ByteWindows, name_index, split_of, stdlib_files, stdlib_root
from normkit_lab.errors import DatasetMissing

SMALL = {"seq_len": 16, "train_windows": 64, "eval_windows": 16}


def _stream(windows: ByteWindows) -> bytes:
    return bytes(windows.stream.tolist())


def test_pysrc_is_the_same_bytes_and_hash_twice():
    a, b = (load_dataset("pysrc", max_files=60, **SMALL) for _ in range(2))
    assert a.metadata == b.metadata and len(a.metadata["sha256"]) == 64
    for split in ("train", "val", "test"):
        assert _stream(getattr(a, split)) == _stream(getattr(b, split))
    assert a.metadata["python"] == ".".join(map(str, sys.version_info[:3]))
    assert a.metadata["bytes_per_token"] == 1.0 and a.num_classes == 256 and a.image_size == 16


def test_pysrc_splits_are_disjoint_whole_files():
    data = load_dataset("pysrc", max_files=60, **SMALL)
    root = stdlib_root()
    files = stdlib_files(root)[:60]
    expected = {"train": b"", "val": b"", "test": b""}
    for path in files:
        expected[split_of(name_index(path.relative_to(root).as_posix()))] += path.read_bytes()
    for split, content in expected.items():
        assert _stream(getattr(data, split)) == content  # each file whole, in exactly one split
    assert sum(data.metadata["documents"].values()) == len(files)
    assert all(data.metadata["documents"][s] > 0 for s in ("train", "val", "test"))


def test_pysrc_hash_changes_with_the_content():
    assert load_dataset("pysrc", max_files=60, **SMALL).metadata["sha256"] != \
        load_dataset("pysrc", max_files=61, **SMALL).metadata["sha256"]


def test_windows_are_next_byte_pairs_evenly_spaced():
    windows = ByteWindows(torch.arange(100, dtype=torch.uint8), seq_len=10, count=4)
    assert windows.starts.tolist() == [0, 30, 59, 89]  # the last start leaves a target for every position
    x, y = windows[3]
    assert x.dtype == torch.int64 and x.tolist() == list(range(89, 99)) and y.tolist() == list(range(90, 100))
    assert len(ByteWindows(torch.arange(12, dtype=torch.uint8), seq_len=10, count=50)) == 2


def test_text_file_splits_by_chunk(tmp_path):
    content = bytes((i * 7 + i // 3) % 251 for i in range(12 * CHUNK_BYTES + 100))
    (tmp_path / "corpus.txt").write_bytes(content)
    data = load_dataset("text", path=str(tmp_path / "corpus.txt"), **SMALL)
    chunks = [content[i:i + CHUNK_BYTES] for i in range(0, len(content), CHUNK_BYTES)]
    assert _stream(data.val) == chunks[8]
    assert _stream(data.test) == chunks[9]
    assert _stream(data.train) == b"".join(c for k, c in enumerate(chunks) if k % 10 < 8)


def test_text_folder_reads_files_in_sorted_order_skipping_hidden(tmp_path):
    for name in ("b.txt", "a.txt", ".hidden.txt"):
        (tmp_path / name).write_bytes(name[0].encode() * (6 * CHUNK_BYTES))
    data = load_dataset("text", path=str(tmp_path), **SMALL)
    assert data.metadata["files"] == 2
    assert _stream(data.train).startswith(b"a" * CHUNK_BYTES) and b"." not in _stream(data.train)


@pytest.mark.parametrize(("params", "error", "message"), [
    ({}, SpecError, "give the file or folder"),
    ({"path": "/no/such/corpus"}, DatasetMissing, "no file or folder at '/no/such/corpus'"),
    ({"path": "TINY", "seq_len": 16}, SpecError, "the val split holds 0 bytes, fewer than seq_len\\+1"),
    ({"path": "TINY", "seq_len": 0}, SpecError, "seq_len must be in"),
])
def test_text_errors_are_one_line(tmp_path, params, error, message):
    (tmp_path / "tiny.txt").write_text("hello world, " * 100)
    if params.get("path") == "TINY":
        params = {**params, "path": str(tmp_path / "tiny.txt")}
    with pytest.raises(error, match=message) as info:
        load_dataset("text", **params)
    assert "\n" not in str(info.value)


def _hf_in_subprocess(tmp_path, fake_module: str, download: bool) -> subprocess.CompletedProcess:
    """Load `hf` in a fresh interpreter whose `datasets` package is the given stand-in."""
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "__init__.py").write_text(fake_module)
    script = textwrap.dedent(f"""
        from normkit_lab.datasets import load_dataset
        from normkit import NormkitError
        try:
            load_dataset("hf", download={download})
        except NormkitError as exc:
            print(type(exc).__name__, exc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)


def test_hf_without_the_datasets_package_says_how_to_get_it(tmp_path):
    out = _hf_in_subprocess(tmp_path, "raise ImportError('not installed')\n", download=True)
    assert out.stdout.strip() == ("DatasetMissing hf: the optional 'datasets' package is not installed; "
                                  "pip install 'datasets>=2.14', or use the offline --dataset pysrc")


def test_hf_asks_for_download_before_touching_the_network(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", types.ModuleType("datasets"))  # importable, never called
    with pytest.raises(DatasetMissing, match="^hf: 'roneneldan/TinyStories' streams from the Hugging Face Hub; "
                                             "pass --download"):
        load_dataset("hf")


def test_the_test_split_gets_its_own_larger_window_count_and_reference_tables():
    data = load_dataset("pysrc", max_files=60, **SMALL)
    assert (len(data.val), len(data.test)) == (16, 1024)  # test_windows defaults above eval_windows
    assert len(load_dataset("pysrc", max_files=60, test_windows=40, **SMALL).test) == 40
    b = data.metadata["baselines"]
    assert b["targets"] == 1024 * 16 and b["fit"] == "train split" and b["scored"] == "test windows"
    assert 0 < b["bigram_bpb"] < b["unigram_bpb"] < 8  # a bigram table knows more than byte frequencies
    assert b["trigram_bpb"] < b["bigram_bpb"]  # and a trigram table more than which byte follows which
    assert b["tuned"] == "validation windows" and b["trigram_k"] in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
    with pytest.raises(SpecError, match="test_windows must be in"):
        load_dataset("pysrc", max_files=60, test_windows=0, **SMALL)


def test_stream_trains_on_every_consecutive_window_of_the_train_split():
    """stream=true: the training windows tile the whole train split (each byte a target once per
    epoch), where train_windows takes evenly spaced windows; val and test stay as they were."""
    fixed = load_dataset("pysrc", max_files=60, **SMALL)
    streamed = load_dataset("pysrc", max_files=60, stream=True, **SMALL)
    seq_len, size = SMALL["seq_len"], streamed.metadata["bytes"]["train"]
    assert len(streamed.train) == (size - 1) // seq_len and len(streamed.train) > 10 * len(fixed.train)
    starts = streamed.train.starts
    assert starts[0] == 0 and (starts[1:] - starts[:-1] == seq_len).all() and starts[-1] + seq_len + 1 <= size
    assert streamed.metadata["stream"] and not fixed.metadata["stream"]
    assert (streamed.test.starts == fixed.test.starts).all()
    assert streamed.metadata["baselines"] == fixed.metadata["baselines"]
