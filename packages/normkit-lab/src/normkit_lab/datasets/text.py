"""Byte-level text corpora for language models (vocabulary 256, no tokenizer to download).

    pysrc   the Python standard library's own .py files (offline, on every machine with Python)
    text    any local text file or folder (--dataset-param path=...)
    hf      a Hugging Face `datasets` corpus (optional extra, needs --download)

A corpus is a list of documents (files, or rows of an hf corpus; a local text is cut into chunks
of CHUNK_BYTES). Every document goes whole to one split (train 80%, val 10%, test 10%), so the
splits never share a document: pysrc and hf decide by a hash of the document's name, text by
the chunk's index. Each split is one byte stream; an item is a window of seq_len bytes and its
next bytes as targets. The windows are evenly spaced over the stream and fixed (the same every
epoch and run; the loader shuffles their order), `train_windows` of them for training, so an
epoch costs the same whatever the corpus's size; `eval_windows` for validation and `test_windows`
(more by default: the test split scores the comparison) for test. With `stream=true` the training
windows are instead every consecutive window of the whole train split (each byte a target once per
epoch), for a run whose length is set by a steps budget (`--budget steps=N`) rather than by
passes. Unigram, bigram and trigram tables fitted on the train split (add-k, k tuned on the
validation windows) are scored on the test windows (`normkit_lab.lm_baselines`) and recorded in the
metadata as reference points. The corpus's SHA-256 goes into the bundle's metadata: pysrc's content
changes with the Python version, and so does its hash.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.errors import DatasetMissing
from normkit_lab.lm_baselines import ngram_baselines

VOCAB = 256
SPLITS = ("train", "val", "test")
CHUNK_BYTES = 16384
DEFAULT_SEQ_LEN = 64
DEFAULT_TRAIN_WINDOWS = 384
DEFAULT_EVAL_WINDOWS = 128
DEFAULT_TEST_WINDOWS = 1024
MAX_WINDOWS = 10_000_000
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


class ByteWindows(Dataset):
    """`count` fixed windows of a byte stream: item i is (bytes[s:s+T], bytes[s+1:s+T+1]) as int64.

    count=None: every consecutive window (starts 0, T, 2T, ...), the whole stream.
    """

    def __init__(self, stream: Tensor, seq_len: int, count: int | None) -> None:
        self.stream = stream
        self.seq_len = seq_len
        last = len(stream) - seq_len - 1  # the last start that still has a target for every position
        if count is None:
            self.starts = torch.arange(0, last + 1, seq_len)
        else:
            self.starts = torch.linspace(0, last, min(count, last + 1)).round().long().unique()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        s = int(self.starts[i])
        window = self.stream[s:s + self.seq_len + 1].long()
        return window[:-1], window[1:]


def split_of(index: int) -> str:
    """The split of a document from an integer key: 8 of 10 train, 1 val, 1 test."""
    return {8: "val", 9: "test"}.get(index % 10, "train")


def name_index(name: str) -> int:
    """A stable integer from a document's name (its split does not move when others are added)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()[:8], "big")


class Corpus:
    """Documents collected into one byte stream per split, with the content hash of all of them."""

    def __init__(self) -> None:
        self.parts: dict[str, list[bytes]] = {s: [] for s in SPLITS}
        self.documents = dict.fromkeys(SPLITS, 0)
        self._hash = hashlib.sha256()

    def add(self, name: str, content: bytes, split: str) -> None:
        self._hash.update(name.encode("utf-8", "surrogateescape") + b"\0"
                          + len(content).to_bytes(8, "big") + content)
        self.parts[split].append(content)
        self.documents[split] += 1

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def streams(self) -> dict[str, Tensor]:
        return {s: torch.frombuffer(bytearray(b"".join(p)), dtype=torch.uint8) if p
                else torch.zeros(0, dtype=torch.uint8) for s, p in self.parts.items()}


def _check_sizes(owner: str, seq_len: int, train_windows: int, eval_windows: int, test_windows: int = 1) -> None:
    for key, value, low in (("seq_len", seq_len, 1), ("train_windows", train_windows, 1),
                            ("eval_windows", eval_windows, 1), ("test_windows", test_windows, 1)):
        if not low <= value <= MAX_WINDOWS:
            raise SpecError(f"{owner}: {key} must be in [{low}, {MAX_WINDOWS}], got {value}")


def bundle(name: str, corpus: Corpus, seq_len: int, train_windows: int, eval_windows: int,
           source: dict[str, object], fix: str, test_windows: int = DEFAULT_TEST_WINDOWS,
           stream_train: bool = False) -> DatasetBundle:
    """Windows over each split's stream (stream_train: every consecutive training window), and the
    metadata the results record."""
    streams = corpus.streams()
    for split, stream in streams.items():
        if len(stream) < seq_len + 1:
            raise SpecError(f"{name}: the {split} split holds {len(stream)} bytes, fewer than seq_len+1 = "
                            f"{seq_len + 1}; {fix}")
    counts = {"train": None if stream_train else train_windows, "val": eval_windows, "test": test_windows}
    windows = {s: ByteWindows(streams[s], seq_len, counts[s]) for s in SPLITS}
    metadata = {
        "corpus": name, "sha256": corpus.sha256, **source, "seq_len": seq_len, "bytes_per_token": 1.0,
        "documents": dict(corpus.documents), "bytes": {s: len(streams[s]) for s in SPLITS},
        "windows": {s: len(windows[s]) for s in SPLITS}, "stream": stream_train,
        "baselines": _baselines(corpus.sha256, streams, windows, seq_len),
    }
    return DatasetBundle(name, windows["train"], windows["val"], num_classes=VOCAB, in_channels=0,
                         image_size=seq_len, test=windows["test"], metadata=metadata)


_BASELINES: dict[tuple[str, int, int, int], dict[str, Any]] = {}  # per process: every run loads its data


def _baselines(sha256: str, streams: dict[str, Tensor], windows: dict[str, ByteWindows],
               seq_len: int) -> dict[str, Any]:
    """The n-gram tables' scores, computed once per corpus and windows in a process (counting a large
    train split's triples takes seconds, and every run of a comparison loads its data again)."""
    key = (sha256, seq_len, len(windows["val"]), len(windows["test"]))
    if key not in _BASELINES:
        _BASELINES[key] = ngram_baselines(streams["train"], streams["val"], windows["val"].starts, streams["test"],
                                          windows["test"].starts, seq_len)
    return dict(_BASELINES[key])


# -- pysrc --------------------------------------------------------------------------------------


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=4)
def stdlib_files(root: Path) -> tuple[Path, ...]:
    """The standard library's .py files in sorted order (installed packages excluded); listed once."""
    return tuple(sorted(p for p in root.rglob("*.py")
                        if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])))


def pysrc(ctx: DatasetContext, seq_len: int = DEFAULT_SEQ_LEN, train_windows: int = DEFAULT_TRAIN_WINDOWS,
          eval_windows: int = DEFAULT_EVAL_WINDOWS, max_files: int | None = None,
          test_windows: int = DEFAULT_TEST_WINDOWS, stream: bool = False) -> DatasetBundle:
    """The standard library's source as bytes; split by file (a hash of its relative path).

    max_files: only the first files in sorted order (a smaller corpus, e.g. for tests); stream: train
    on every consecutive window of the train split (train_windows unused).
    """
    _check_sizes("pysrc", seq_len, train_windows, eval_windows, test_windows)
    if max_files is not None and max_files < 10:
        raise SpecError(f"pysrc: max_files must be >= 10 (or unset for every file), got {max_files}")
    root = stdlib_root()
    files = stdlib_files(root)[:max_files] if root.is_dir() else ()
    if not files:
        raise DatasetMissing(f"pysrc: no Python source files under {str(root)!r} (this Python ships "
                             f"without its standard library source); use --dataset text --dataset-param path=...")
    corpus = Corpus()
    for path in files:
        rel = path.relative_to(root).as_posix()
        corpus.add(rel, path.read_bytes(), split_of(name_index(rel)))
    source = {"python": platform.python_version(), "implementation": platform.python_implementation(),
              "files": len(files)}
    return bundle("pysrc", corpus, seq_len, train_windows, eval_windows, source,
                  "raise max_files or lower seq_len", test_windows, stream)


# -- text ---------------------------------------------------------------------------------------


def text_files(path: Path) -> list[Path]:
    """A file itself, or a folder's regular files in sorted order (hidden files and folders skipped)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


def chunks(data: bytes, size: int) -> Iterable[bytes]:
    return (data[i:i + size] for i in range(0, len(data), size))


def text(ctx: DatasetContext, path: str = "", seq_len: int = DEFAULT_SEQ_LEN,
         train_windows: int = DEFAULT_TRAIN_WINDOWS, eval_windows: int = DEFAULT_EVAL_WINDOWS,
         test_windows: int = DEFAULT_TEST_WINDOWS, stream: bool = False) -> DatasetBundle:
    """A local file or folder (files concatenated in sorted order), split by 16 KiB chunk; stream: train
    on every consecutive window of the train split."""
    _check_sizes("text", seq_len, train_windows, eval_windows, test_windows)
    if not path:
        raise SpecError("text: give the file or folder to read with --dataset-param path=...")
    root = Path(os.path.expanduser(path))
    if not root.exists():
        raise DatasetMissing(f"text: no file or folder at {path!r}; check --dataset-param path=...")
    try:
        files = text_files(root)
        data = b"".join(f.read_bytes() for f in files)
    except OSError as exc:
        raise DatasetMissing(f"text: cannot read {path!r}: {exc.strerror or exc}") from None
    corpus = Corpus()
    for k, chunk in enumerate(chunks(data, CHUNK_BYTES)):
        corpus.add(f"chunk-{k}", chunk, split_of(k))
    return bundle("text", corpus, seq_len, train_windows, eval_windows,
                  {"path": str(root.resolve()), "files": len(files)},
                  f"give more text (at least 10 chunks of {CHUNK_BYTES} bytes) or a shorter seq_len", test_windows,
                  stream)


# -- hf -----------------------------------------------------------------------------------------


def hf(ctx: DatasetContext, name: str = "roneneldan/TinyStories", config: str | None = None,
       split: str = "train", field: str = "text", max_mb: float = 16.0, seq_len: int = DEFAULT_SEQ_LEN,
       train_windows: int = DEFAULT_TRAIN_WINDOWS, eval_windows: int = DEFAULT_EVAL_WINDOWS,
       test_windows: int = DEFAULT_TEST_WINDOWS, stream: bool = False) -> DatasetBundle:
    """The first `max_mb` MB (UTF-8) of a Hugging Face corpus, streamed; split by row (hash of its index).
    stream: train on every consecutive window of the train split.

    Needs the optional `datasets` package and --download (it streams from the Hub; --data-dir
    is its cache). E.g. roneneldan/TinyStories, or HuggingFaceFW/fineweb with config sample-10BT.
    """
    _check_sizes("hf", seq_len, train_windows, eval_windows, test_windows)
    if not 0 < max_mb <= 100_000:
        raise SpecError(f"hf: max_mb must be in (0, 100000], got {max_mb}")
    try:
        import datasets
    except ImportError:
        raise DatasetMissing("hf: the optional 'datasets' package is not installed; pip install 'datasets>=2.14', "
                             "or use the offline --dataset pysrc") from None
    if not ctx.download:
        raise DatasetMissing(f"hf: {name!r} streams from the Hugging Face Hub; pass --download "
                             f"(or use the offline --dataset pysrc)")
    corpus, budget = Corpus(), int(max_mb * 1e6)
    try:
        rows = datasets.load_dataset(name, config, split=split, streaming=True, cache_dir=ctx.data_dir)
        for k, row in enumerate(rows):
            if budget <= 0:
                break
            if field not in row:
                raise SpecError(f"hf: {name!r} rows have no field {field!r}; fields: {', '.join(row)}; "
                                f"pass --dataset-param field=...")
            content = str(row[field]).encode("utf-8")
            corpus.add(f"row-{k}", content, split_of(name_index(f"row-{k}")))
            budget -= len(content)
    except (SpecError, DatasetMissing):
        raise
    except Exception as exc:  # network, authentication, unknown corpus: the datasets library's own errors
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise DatasetMissing(f"hf: cannot load {name!r} ({type(exc).__name__}: {first}); check the name, "
                             f"the network, or use the offline --dataset pysrc") from None
    return bundle("hf", corpus, seq_len, train_windows, eval_windows,
                  {"hf_name": name, "hf_config": config, "hf_split": split, "max_mb": max_mb},
                  "raise max_mb or lower seq_len", test_windows, stream)
