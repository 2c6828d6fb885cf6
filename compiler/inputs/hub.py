"""What `memspec import` reads of a checkpoint: config.json, preprocessor_config.json and the
safetensors headers, from a local folder or from the Hugging Face hub. Never the weights.

Contract: `open_checkpoint(source, revision=None)` returns a frozen `Checkpoint`. A source
that is an existing folder is read from disk; anything else is a hub repo id, fetched with
huggingface_hub (`hf_hub_download` for the JSON files, a ranged read of each shard's header
otherwise), which caches them and honours HF_TOKEN and HF_HUB_OFFLINE. A shard already in
the cache is read from there; a header fetched over the network is kept in memspec's own
cache (`$MEMSPEC_CACHE`, default `~/.cache/memspec`) by commit, so a second import runs
offline. Every failure is one `MemspecError` naming the repo and revision (or the folder)
and what to do next.

huggingface_hub is imported only inside the functions that talk to the hub: `import
compiler` and estimating a spec file never load it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError

CONFIG_FILE = "config.json"
PROCESSOR_FILE = "preprocessor_config.json"
SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# safetensors' own limit on the header (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
HEADER_LENGTH_BYTES = 8  # little-endian u64 before the JSON header
# Element sizes of the safetensors dtypes (safetensors/src/tensor.rs, Dtype::size).
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# Companion tensors of quantized weights: bitsandbytes 4-bit (absmax, quant_map, quant_state),
# bitsandbytes int8 (SCB, weight_format), GPTQ/AWQ (qweight, qzeros, scales, g_idx), FP8
# (weight_scale, input_scale).
QUANTIZED_SUFFIXES = (
    ".absmax",
    ".quant_map",
    ".nested_absmax",
    ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4",
    ".quant_state.bitsandbytes__fp4",
    ".SCB",
    ".weight_format",
    ".qweight",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".weight_scale",
    ".input_scale",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # the shard holding it

    @property
    def elements(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Checkpoint:
    source: str  # the repo id or the folder, as given
    revision: str | None  # the commit read (hub), None for a folder
    local: bool
    config: Mapping[str, Any]
    processor: Mapping[str, Any] | None
    tensors: tuple[Tensor, ...] | None  # None: no safetensors (weights in .bin only)
    weight_files: tuple[str, ...]  # the safetensors shards, or the .bin files

    @property
    def where(self) -> str:
        """How errors name the source, as huggingface_hub does."""
        if self.local:
            return f"folder '{self.source}'"
        return f"repo '{self.source}', revision '{self.revision}'"


def is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and not text.endswith((".yaml", ".yml", ".json"))


def open_checkpoint(source: str, revision: str | None = None) -> Checkpoint:
    if Path(source).is_dir():
        if revision:
            raise MemspecError(
                _diag(
                    "E704",
                    f"folder '{source}'",
                    "--revision applies to a hub repo, not to a local folder",
                    "check out the revision into the folder, or give the repo id",
                )
            )
        return _local(source)
    if not is_repo_id(source):
        raise MemspecError(
            _diag(
                "E701",
                f"'{source}'",
                "is neither a model folder nor a Hugging Face repo id (owner/name)",
                "give a folder holding config.json and *.safetensors, or a repo id such as meta-llama/Llama-2-7b-hf",
            )
        )
    return _hub(source, revision)


def _diag(code: str, where: str, message: str, help: str | None = None) -> Diagnostic:
    return Diagnostic(code, "", 0, 0, "", f"{where}: {message}", help)


# --------------------------------------------------------------------------- headers


def read_header(path: str | Path, where: str) -> dict[str, Any]:
    """The JSON header of one safetensors file; only the header bytes are read."""
    name = Path(path).name
    with open(path, "rb") as f:
        prefix = f.read(HEADER_LENGTH_BYTES)
        if len(prefix) < HEADER_LENGTH_BYTES:
            raise MemspecError(
                _diag(
                    "E707",
                    where,
                    f"{name} is truncated: {len(prefix)} bytes, fewer than the {HEADER_LENGTH_BYTES}-byte header length",
                    "the file is incomplete: download it again",
                )
            )
        length = int.from_bytes(prefix, "little")
        _check_length(length, name, where)
        body = f.read(length)
    if len(body) < length:
        raise MemspecError(
            _diag(
                "E707",
                where,
                f"{name} is truncated: its header declares {length:,} bytes, the file holds {len(body):,}",
                "the file is incomplete: download it again",
            )
        )
    return parse_header(body, name, where)


def _check_length(length: int, name: str, where: str) -> None:
    if length > MAX_HEADER_BYTES:
        raise MemspecError(
            _diag(
                "E707",
                where,
                f"{name}: header length {length:,} bytes exceeds safetensors' limit of {MAX_HEADER_BYTES:,}",
                "the file is not a safetensors file or is corrupt",
            )
        )


def parse_header(body: bytes, name: str, where: str) -> dict[str, Any]:
    try:
        header = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MemspecError(_diag("E707", where, f"{name}: the header is not valid JSON ({exc})", "the file is not a safetensors file or is corrupt")) from None
    if not isinstance(header, dict):
        raise MemspecError(_diag("E707", where, f"{name}: the header is not a JSON object", "the file is not a safetensors file or is corrupt"))
    return header


def tensors_of(header: Mapping[str, Any], file: str, where: str) -> list[Tensor]:
    out = []
    for tensor_name, info in header.items():
        if tensor_name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise MemspecError(
                _diag(
                    "E707",
                    where,
                    f"{file}: tensor '{tensor_name}' has no valid dtype, shape and data_offsets",
                    "the file is not a safetensors file or is corrupt",
                )
            ) from None
        size = DTYPE_BYTES.get(dtype)
        if size is not None and end - begin != prod(shape) * size:
            raise MemspecError(
                _diag(
                    "E707",
                    where,
                    f"{file}: tensor '{tensor_name}' {dtype}{list(shape)} needs {prod(shape) * size:,} bytes, its data_offsets span {end - begin:,}",
                    "the header is inconsistent: the file is corrupt",
                )
            )
        out.append(Tensor(tensor_name, dtype, shape, file))
    return out


def _shards(index_path: Path, where: str) -> list[str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        return sorted(set(index["weight_map"].values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise MemspecError(
            _diag(
                "E707", where, f"{index_path.name} is not a valid index ({type(exc).__name__}: {exc})", "it maps tensor names to shard files under 'weight_map'"
            )
        ) from None


def _read_json(path: Path, where: str, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if not required:
            return None
        raise MemspecError(_diag("E705", where, f"no {path.name}", "a model folder holds config.json next to its *.safetensors files"))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MemspecError(_diag("E705", where, f"{path.name} is not valid JSON ({exc})", "compare it with the one on the hub")) from None
    if not isinstance(data, dict):
        raise MemspecError(_diag("E705", where, f"{path.name} is not a JSON object"))
    return data


# --------------------------------------------------------------------------- a local folder


def _local(source: str) -> Checkpoint:
    folder = Path(source)
    where = f"folder '{source}'"
    config = _read_json(folder / CONFIG_FILE, where, required=True)
    processor = _read_json(folder / PROCESSOR_FILE, where, required=False)
    if (folder / SAFETENSORS_INDEX).is_file():
        files = _shards(folder / SAFETENSORS_INDEX, where)
    elif (folder / SAFETENSORS_SINGLE).is_file():
        files = [SAFETENSORS_SINGLE]
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        bins = tuple(sorted(p.name for p in folder.glob("*.bin")))
        return Checkpoint(source, None, True, config, processor, None, bins)
    tensors: list[Tensor] = []
    for name in files:
        if not (folder / name).is_file():
            raise MemspecError(
                _diag("E707", where, f"shard {name} (listed in {SAFETENSORS_INDEX}) is missing", "copy every shard the index lists into the folder")
            )
        tensors.extend(tensors_of(read_header(folder / name, where), name, where))
    return Checkpoint(source, None, True, config, processor, tuple(tensors), tuple(files))


# --------------------------------------------------------------------------- the hub


def _hub_errors(repo: str, revision: str | None, exc: Exception, what: str) -> MemspecError:
    from huggingface_hub import errors as e

    where = f"repo '{repo}', revision '{revision or 'main'}'"
    if isinstance(exc, e.GatedRepoError):
        return MemspecError(
            _diag(
                "E702",
                where,
                "the repository is gated: your account has not been granted access, or no token was sent",
                f"accept the license on https://huggingface.co/{repo}, then set HF_TOKEN (or run `hf auth login`) and retry",
            )
        )
    if isinstance(exc, e.RepositoryNotFoundError):
        return MemspecError(
            _diag(
                "E701",
                where,
                "repository not found on the Hugging Face hub (or it is private)",
                "check the id (owner/name); for a private repo set HF_TOKEN (or run `hf auth login`)",
            )
        )
    if isinstance(exc, e.RevisionNotFoundError):
        return MemspecError(_diag("E704", where, "revision not found", "give a branch, tag or commit of the repo with --revision"))
    if isinstance(exc, (e.OfflineModeIsEnabled, e.LocalEntryNotFoundError)):
        offline = _offline()
        reason = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        return MemspecError(
            _diag(
                "E703",
                where,
                f"{what} is not in the local cache and {reason}",
                "run the same command once with network access (unset HF_HUB_OFFLINE), or import from a local folder",
            )
        )
    if isinstance(exc, e.EntryNotFoundError):
        return MemspecError(_diag("E705", where, f"no {what} in the repository", "a model repo holds config.json; check the id and --revision"))
    if isinstance(exc, e.SafetensorsParsingError):
        return MemspecError(_diag("E707", where, f"{what}: {exc}", "the file is not a safetensors file or is corrupt"))
    return MemspecError(
        _diag(
            "E703",
            where,
            f"fetching {what} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "check the network and retry; HF_HUB_OFFLINE=1 uses the local cache only",
        )
    )


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


# Seconds the reachability probe waits for a TCP connection to the hub's endpoint.
PROBE_TIMEOUT_S = 3.0
_PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@lru_cache(maxsize=1)
def _unreachable() -> bool:
    """The hub's endpoint refuses a TCP connection, or none comes within PROBE_TIMEOUT_S.

    NB: without it a machine without network waits through huggingface_hub's timeouts and
    retries (about 23 s) before the same error; behind a proxy the probe is skipped, since
    only the proxy knows whether the hub is there."""
    if any(os.environ.get(k) for k in _PROXIES):
        return False
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return True
    return False


def _local_only() -> bool:
    """The cache only: HF_HUB_OFFLINE is set, or the hub cannot be reached."""
    return _offline() or _unreachable()


def _download(repo: str, filename: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=_local_only()))


def _hub(repo: str, revision: str | None) -> Checkpoint:
    from huggingface_hub import errors as e

    try:
        config_path = _download(repo, CONFIG_FILE, revision)
    except Exception as exc:  # NB: every huggingface_hub failure becomes one located error
        raise _hub_errors(repo, revision, exc, CONFIG_FILE) from None
    snapshot = config_path.parent
    commit = snapshot.name  # hf_hub_download returns .../snapshots/<commit>/config.json
    where = f"repo '{repo}', revision '{commit}'"
    config = _read_json(config_path, where, required=True)
    try:
        processor = _read_json(_download(repo, PROCESSOR_FILE, commit), where, required=False)
    except (e.EntryNotFoundError, e.LocalEntryNotFoundError):
        processor = None  # NB: offline, "not cached" and "not in the repo" look alike; the family's defaults apply
    except Exception as exc:
        raise _hub_errors(repo, commit, exc, PROCESSOR_FILE) from None
    files = _hub_weight_files(repo, commit, snapshot)
    if files is None:
        bins = tuple(f for f in BIN_FILES if _exists(repo, commit, snapshot, f))
        return Checkpoint(repo, commit, False, config, processor, None, bins)
    tensors: list[Tensor] = []
    for name in files:
        tensors.extend(tensors_of(_hub_header(repo, commit, snapshot, name, where), name, where))
    return Checkpoint(repo, commit, False, config, processor, tuple(tensors), tuple(files))


def _exists(repo: str, commit: str, snapshot: Path, filename: str) -> bool:
    """Whether the repo has `filename`: the cache first, then the hub (a HEAD request)."""
    if (snapshot / filename).is_file():
        return True
    if _local_only():
        return False
    from huggingface_hub import file_exists

    try:
        return file_exists(repo, filename, revision=commit)
    except Exception as exc:
        raise _hub_errors(repo, commit, exc, filename) from None


def _hub_weight_files(repo: str, commit: str, snapshot: Path) -> list[str] | None:
    """The safetensors shards, or None when the repo has none."""
    where = f"repo '{repo}', revision '{commit}'"
    if _exists(repo, commit, snapshot, SAFETENSORS_INDEX):
        try:
            return _shards(_download(repo, SAFETENSORS_INDEX, commit), where)
        except MemspecError:
            raise
        except Exception as exc:
            raise _hub_errors(repo, commit, exc, SAFETENSORS_INDEX) from None
    if _exists(repo, commit, snapshot, SAFETENSORS_SINGLE):
        return [SAFETENSORS_SINGLE]
    if _local_only() and not any((snapshot / f).is_file() for f in BIN_FILES):
        raise MemspecError(
            _diag(
                "E703",
                where,
                f"neither {SAFETENSORS_INDEX} nor {SAFETENSORS_SINGLE} is in the local cache and HF_HUB_OFFLINE is set",
                "run the same command once with network access (unset HF_HUB_OFFLINE), or import from a local folder",
            )
        )
    return None


def cache_dir() -> Path:
    """memspec's cache of safetensors headers fetched from the hub, by repo and commit."""
    from ..paths import user_cache

    return user_cache() / "safetensors-headers"


def _hub_header(repo: str, commit: str, snapshot: Path, filename: str, where: str) -> dict[str, Any]:
    if (snapshot / filename).is_file():  # the weights are in huggingface_hub's cache already
        return read_header(snapshot / filename, where)
    cached = cache_dir() / repo.replace("/", "--") / commit / (filename + ".header.json")
    if cached.is_file():
        return parse_header(cached.read_bytes(), filename, where)
    if _local_only():
        reason = "HF_HUB_OFFLINE is set" if _offline() else "the hub cannot be reached"
        raise MemspecError(
            _diag(
                "E703",
                where,
                f"the header of {filename} is not in the local cache and {reason}",
                "run the same command once with network access (unset HF_HUB_OFFLINE), or import from a local folder",
            )
        )
    body = _fetch_header(repo, commit, filename, where)
    header = parse_header(body, filename, where)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, cached)
    return header


def _fetch_header(repo: str, commit: str, filename: str, where: str) -> bytes:
    """The header of one shard as JSON bytes, by huggingface_hub's ranged read (never the weights)."""
    from huggingface_hub import HfApi

    try:
        meta = HfApi().parse_safetensors_file_metadata(repo, filename, revision=commit)
    except Exception as exc:
        raise _hub_errors(repo, commit, exc, filename) from None
    header: dict[str, Any] = {"__metadata__": dict(meta.metadata or {})}
    for name, info in meta.tensors.items():
        header[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
    return json.dumps(header, separators=(",", ":")).encode("utf-8")
