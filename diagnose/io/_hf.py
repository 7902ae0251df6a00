"""Hugging Face model folders (config.json + weights, with the tokenizer when it is there).

Only local files are read; nothing is fetched and no code from the folder runs: every
from_pretrained gets trust_remote_code=False (so transformers neither prompts nor imports the
folder's .py files), and a folder that only its own code could build is refused before
transformers sees it.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch.nn as nn

from .._numbers import kind
from ..errors import ConfigError, InputFileError
from ._files import one_line
from ._kinds import folder_kind
from ._read import read_json, special_kind

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "tokenizer.model", "spiece.model")
# config.architectures names the exact class; these suffixes pick an Auto class when that
# class is not in this transformers version.
_AUTO_BY_SUFFIX = (
    ("ForCausalLM", "AutoModelForCausalLM"),
    ("LMHeadModel", "AutoModelForCausalLM"),
    ("ForSequenceClassification", "AutoModelForSequenceClassification"),
    ("ForTokenClassification", "AutoModelForTokenClassification"),
    ("ForMaskedLM", "AutoModelForMaskedLM"),
)


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("reading a Hugging Face model folder needs transformers: "
                          "pip install 'diagnose[transformers]'") from None
    return transformers


@contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """Silence transformers' progress bars and warnings so the CLI prints only its own lines."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _refuse_own_code(folder: Path, transformers: Any) -> None:
    """Refuse a folder whose config.json names a model_type this transformers does not know.

    Such a folder (usually with an `auto_map` to its own configuration_*.py / modeling_*.py)
    can only be built by running the folder's code, which diagnose never does.
    """
    config = read_json(folder / "config.json", "model config",
                       "re-save the folder with model.save_pretrained(folder)", limit=16 << 20)
    if not isinstance(config, dict):
        raise InputFileError(f"{folder / 'config.json'}: holds a JSON {type(config).__name__}, not an object; "
                             "re-save the folder with model.save_pretrained(folder)")
    model_type = config.get("model_type")
    known = transformers.CONFIG_MAPPING
    if isinstance(model_type, str) and model_type in known:
        return
    own = sorted({str(v).split(".")[0] + ".py" for v in _auto_map_targets(config.get("auto_map"))})
    ships = f" and ships its own code ({', '.join(own[:3])})" if own else ""
    name = repr(model_type) if isinstance(model_type, str) else "no model_type"
    raise InputFileError(
        f"{folder}: config.json has {name}, which transformers {transformers.__version__} has no built-in "
        f"class for{ships}; diagnose never runs code from a model folder: build the model in a --factory "
        "module:function and pass its state_dict, or save it with its family's built-in transformers class")


def _auto_map_targets(auto_map: Any) -> list[str]:
    """'configuration_x.XConfig'-style entries of an auto_map (values may be lists or pairs)."""
    if not isinstance(auto_map, dict):
        return []
    out = []
    for value in auto_map.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and "--" not in item:  # "repo--module.Class" points at a hub repo
                out.append(item)
    return out


def model_class(transformers: Any, config: Any, where: Path | None = None) -> Any:
    """The model class config.architectures names, else the Auto class for its suffix, else AutoModel.

    Only a PreTrainedModel subclass counts: `architectures: ["pipeline"]` names a function of
    transformers, not a model; anything but a list of names is refused."""
    archs = getattr(config, "architectures", None)
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        what = "a list holding more than names" if isinstance(archs, list) else kind(archs)
        raise InputFileError(f"{where or 'config.json'}: `architectures` is {what}, not a list of model class "
                             "names; re-save the folder with model.save_pretrained(folder)")
    arch = (archs or [None])[0]
    found = getattr(transformers, arch, None) if arch else None
    if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
        return found
    for suffix, auto in _AUTO_BY_SUFFIX:
        if arch and arch.endswith(suffix):
            return getattr(transformers, auto)
    return transformers.AutoModel


def refuse_special_files(folder: Path) -> None:
    """A FIFO or device among the folder's files would block or never end once transformers opens it."""
    try:
        entries = sorted(folder.iterdir())[:10_000]
    except OSError as exc:
        raise InputFileError(f"{folder}: cannot be listed ({exc.strerror}); check its permissions") from None
    for entry in entries:
        kind = special_kind(entry)
        if kind:
            raise InputFileError(f"{entry}: is {kind}, not a regular file; diagnose reads only regular files: "
                                 "put the real file in the model folder")


def load_hf_folder(folder: Path, *, attn_implementation: str | None = None) -> nn.Module:
    """Load the model (and tokenizer, as model.diagnose_tokenizer) from a save_pretrained folder."""
    refuse_special_files(folder)
    if not (folder / "config.json").is_file():
        raise InputFileError(f"{folder}: a folder without config.json is not a model; write a Hugging Face "
                             "model folder with model.save_pretrained(folder)")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise InputFileError(f"{folder}: has config.json but no weights ({', '.join(WEIGHT_FILES[::2])}); "
                             "write them with model.save_pretrained(folder)")
    transformers = _transformers()
    _refuse_own_code(folder, transformers)
    with _quiet(transformers):
        try:
            config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # ValueError (unknown model_type, remote code), OSError, JSON errors
            raise InputFileError(f"{folder / 'config.json'}: transformers cannot read it ({one_line(exc)}); "
                                 "diagnose runs no code from model folders: build such a model in a "
                                 "--factory function instead") from None
        _check_layer_count(folder, config)
        cls = model_class(transformers, config, folder / "config.json")
        kind = folder_kind(folder, config)  # a diagnose_* field (a pruned folder): checked, then rebuilt
        if kind is not None:  # with diagnose's own code, never the folder's
            cls = kind.model_class(folder, config, cls, transformers)
        kwargs: dict[str, Any] = {"config": config, "local_files_only": True, "output_loading_info": True,
                                  "trust_remote_code": False}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        try:
            model, info = cls.from_pretrained(folder, **kwargs)
        except (ImportError, ValueError) as exc:
            if attn_implementation:
                raise ConfigError(f"{folder}: attn_implementation={attn_implementation!r} is not available "
                                  f"({one_line(exc)}); try 'eager' or 'sdpa'") from None
            raise InputFileError(f"{folder}: {cls.__name__} could not load it ({one_line(exc)})") from None
        except Exception as exc:  # OSError, RuntimeError on shape mismatch, safetensors errors
            raise InputFileError(f"{folder}: {cls.__name__} could not load its weights ({one_line(exc)}); "
                                 "re-save the folder with model.save_pretrained(folder)") from None
        missing = sorted(info.get("missing_keys") or ())
        if missing:
            # transformers would fill these with random values: an analysis of that is meaningless
            raise InputFileError(f"{folder}: the weights lack {len(missing)} tensors {cls.__name__} needs "
                                 f"(e.g. {missing[0]}); save the model with model.save_pretrained(folder)")
        model.diagnose_tokenizer = load_tokenizer(folder, transformers)
    model.diagnose_format = "Hugging Face folder"
    return model.eval()


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:h|layer|layers|block|blocks)\.(\d+)\.")


def _weight_names(folder: Path) -> list[str] | None:
    """Tensor names from the safetensors header or the shard index (cheap), else None."""
    index = next((folder / n for n in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if (folder / n).is_file()), None)
    if index is not None:
        data = read_json(index, "weights index", "re-save the folder with model.save_pretrained(folder)")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        return [str(k) for k in weight_map] if isinstance(weight_map, dict) else None
    if (folder / "model.safetensors").is_file():
        from safetensors import safe_open
        try:
            with safe_open(str(folder / "model.safetensors"), "pt") as f:  # reads the header only
                return list(f.keys())
        except Exception as exc:  # SafetensorError, OSError: transformers will say it again, with context
            raise InputFileError(f"{folder / 'model.safetensors'}: not a readable safetensors file "
                                 f"({one_line(exc)}); re-save the folder with model.save_pretrained(folder)") from None
    return None


def weight_shapes(folder: Path) -> dict[str, list[int]] | None:
    """{tensor name: shape} from the safetensors header(s) of a model folder (no tensor is read);
    None when its weights are not safetensors."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index, "weights index", "re-save the folder with model.save_pretrained(folder)")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            return None
        files = sorted({str(v) for v in weight_map.values() if isinstance(v, str) and "/" not in v})
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        return None
    out: dict[str, list[int]] = {}
    for name in files:
        try:
            with safe_open(str(folder / name), "pt") as f:  # the header only
                for key in f.keys():
                    out[key] = list(f.get_slice(key).get_shape())
        except Exception as exc:  # SafetensorError, OSError
            raise InputFileError(f"{folder / name}: not a readable safetensors file ({type(exc).__name__}); "
                                 "re-save the folder with model.save_pretrained(folder)") from None
    return out


def _check_layer_count(folder: Path, config: Any) -> None:
    """Refuse a config.json that claims far more layers than the weights hold, before transformers
    builds them (100,000 claimed layers took minutes to build, only to be found missing)."""
    n = getattr(config, "num_hidden_layers", None)
    names = _weight_names(folder)
    if not isinstance(n, int) or not names:
        return
    indices = {int(m.group(1)) for m in map(_LAYER_INDEX.search, names) if m}
    # Only an absurd claim is refused here: some families number their weights by block or share
    # layers (Funnel, ALBERT), and transformers' own missing-weights check catches the rest.
    if indices and n > max(2 * (max(indices) + 1), max(indices) + 65):
        raise InputFileError(f"{folder / 'config.json'}: says num_hidden_layers={n}, but the weights hold "
                             f"{max(indices) + 1} layers; re-save the folder with model.save_pretrained(folder)")


def load_tokenizer(folder: Path, transformers: Any | None = None) -> Any | None:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    transformers = transformers or _transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # tokenizer classes raise ValueError, OSError, TypeError, ...
        raise InputFileError(f"{folder}: has tokenizer files that cannot be loaded ({one_line(exc)}); "
                             "re-save them with tokenizer.save_pretrained(folder)") from None
