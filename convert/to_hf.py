"""A grpolab checkpoint as a transformers `save_pretrained` folder you can trust (Miles' `convert_fsdp_to_hf.py`).

`export_to_hf(ckpt, out, origin)` builds the origin model (`--origin-hf-dir`: the run's `--hf-checkpoint`,
a directory or a .gguf file), maps every tensor of the checkpoint's `model.safetensors` onto it exactly
once, saves model (safetensors), config, generation config and tokenizer (with its chat template), then
checks the folder: transformers loads it on its own and gives, on fixed prompts, the log-probs of the
model it was saved from, bitwise in float32 (`core/sequence_forward.rescored`, the trainer's forward).
The folder also holds `grpolab_export.json`: the checkpoint's path, its `trainer_state.json` counters
(next rollout, weight version, data position) and the SHA-256 of every exported tensor.

Mapping (Miles #735: conversions that broke on wrapped or tied models): the origin's parameters are
grouped by storage (a tied `lm_head.weight` shares `model.embed_tokens.weight`'s); each group must be
named by exactly one checkpoint tensor of its shape, and every checkpoint tensor must name a group. A
refused export names the tensor. The folder is written beside OUT and renamed into place (atomic); an
existing non-empty OUT must be an earlier export (it holds `grpolab_export.json`) and needs `force`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab.core.atomic import current_umask

PROMPTS = ([1, 17, 33, 5, 9], [9, 8, 7, 100, 200, 300, 4], [3, 3, 3])
"""Token ids scored on both models after the export (any ids of the vocabulary; reduced modulo its size)."""
EXPORT_FILE = "grpolab_export.json"


class ExportError(ValueError):
    """The checkpoint cannot be exported as asked (the message names the file, flag or tensor)."""


@dataclass
class Export:
    """What was written: the folder, the tensors mapped, the tied names, and the verified positions."""

    out: Path
    tensors: int
    tied: list[str]
    verified_positions: int


def _tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """The model's state-dict names grouped by shared storage (a tied head and embedding: one group)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(tensor.data_ptr(), []).append(name)
    return list(groups.values())


def map_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[str]:
    """Copy `weights` into `model`, each storage group named exactly once; return the tied aliases.

    Raises:
        ExportError: a checkpoint tensor that names no parameter of the model, a parameter no tensor names,
            two tensors for one tied parameter, or a shape that differs (each named).
    """
    known = {n for group in _tied_groups(model) for n in group}
    unknown = sorted(set(weights) - known)
    if unknown:
        raise ExportError(f"checkpoint tensor {unknown[0]} names no parameter of the origin model"
                          f"{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}: is --origin-hf-dir "
                          "the model this run trained?")  # fmt: skip
    state = model.state_dict()
    tied: list[str] = []
    full: dict[str, torch.Tensor] = {}
    for group in _tied_groups(model):
        named = [n for n in group if n in weights]
        if not named:
            raise ExportError(f"no checkpoint tensor for the origin's {group[0]}"
                              f"{' (tied with ' + ', '.join(group[1:]) + ')' if len(group) > 1 else ''}")  # fmt: skip
        if len(named) > 1:
            raise ExportError(f"{' and '.join(named)} are one tied parameter of the origin model, but the checkpoint "
                              "holds a tensor for each: it would be mapped twice")  # fmt: skip
        name = named[0]
        if weights[name].shape != state[name].shape:
            raise ExportError(f"checkpoint tensor {name} has shape {tuple(weights[name].shape)}, the origin's "
                              f"{tuple(state[name].shape)}")  # fmt: skip
        tied += [n for n in group if n != name]
        full.update(dict.fromkeys(group, weights[name]))
    with torch.no_grad():
        model.load_state_dict(full, strict=True)
    return tied


def _log_probs(model: torch.nn.Module, vocab: int) -> list[torch.Tensor]:
    """Each fixed prompt's log-probs of its own tokens after the first, float32, by the trainer's forward."""
    from grpolab.core.sequence_forward import Answer, rescored

    answers = [Answer([p[0] % vocab], [t % vocab for t in p[1:]], None) for p in PROMPTS]
    with torch.inference_mode():
        return rescored(model, answers, temperature=1.0, vocab_size=vocab, device="cpu")


def check_output_dir(out: Path, ckpt: Path, *, force: bool, origin: str | None = None) -> None:
    """`--output-dir` may be written: a directory (or nothing yet) that is empty, or with `force` an earlier
    export (a folder holding `EXPORT_FILE`: `--force` replaces exports, never other folders); and neither
    the checkpoint, a folder holding it, a folder inside it, the origin model (`origin`), nor the working
    directory or a folder holding it (`--force` replaces OUT whole: it must never take them with it).

    Raises:
        ExportError: naming `--output-dir` and why.
    """
    if out.exists() and not out.is_dir():
        raise ExportError(
            f"--output-dir {out} is a file; expected a directory (new, or empty, or an earlier export with --force)"
        )
    mine, source = out.resolve(), ckpt.resolve()
    if mine == source or mine in source.parents or source in mine.parents:
        where = "inside" if source in mine.parents else "" if mine == source else "a folder holding "
        raise ExportError(f"--output-dir {out} is {where + ' ' if where == 'inside' else where}the checkpoint --to-hf {ckpt}; write the export elsewhere "
                          "(--force replaces --output-dir whole)")  # fmt: skip
    if origin is not None and Path(origin).exists():
        model = Path(origin).resolve()
        if mine == model or mine in model.parents:
            raise ExportError(f"--output-dir {out} is or holds the origin model --origin-hf-dir {origin}; write the "
                              "export elsewhere")  # fmt: skip
    here = Path.cwd().resolve()
    if mine == here or mine in here.parents:
        raise ExportError(
            f"--output-dir {out} is or holds the working directory {here}; write the export elsewhere"
        )
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ExportError(
                f"--output-dir {out} exists and is not empty; pass --force to replace an earlier export"
            )
        if not _is_export(out):
            raise ExportError(f"--output-dir {out} is not empty and holds no {EXPORT_FILE} of an export: --force "
                              "replaces an earlier export only, never another folder (empty it or choose a new one)")  # fmt: skip


def _is_export(folder: Path) -> bool:
    """`folder` holds an export's record: `EXPORT_FILE` as `export_to_hf` writes it (a JSON object with the
    checkpoint's path and every tensor's SHA-256) beside a `config.json`; a file of that name alone is not one."""
    try:
        facts = json.loads((folder / EXPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(facts, dict)
        and isinstance(facts.get("checkpoint"), str)
        and isinstance(facts.get("tensor_sha256"), dict)
        and (folder / "config.json").is_file()
    )


def export_to_hf(ckpt: Path, out: Path, origin: str, *, force: bool = False) -> Export:
    """Write `ckpt` (an `iter_*` folder of `--save`) as a save_pretrained folder at `out` (module docstring).

    Raises:
        ExportError: no checkpoint there, `out` not empty without `force`, a tensor that does not map, or
            an export that does not load back to the same log-probs (naming what differs).
        FileNotFoundError: `origin` does not exist.
    """
    from safetensors.torch import load_file

    from grpolab.core.checkpoint import read_trainer_state
    from grpolab.core.model_files import compare_model_fingerprints
    from grpolab.core.modeling import load_causal_lm, load_tokenizer, model_fingerprint

    weights_file = ckpt / "model.safetensors"
    if not (ckpt / "trainer_state.json").is_file() or not weights_file.is_file():
        raise ExportError(f"--to-hf {ckpt}: not a grpolab checkpoint (expected an iter_* folder of --save with "
                          "model.safetensors and trainer_state.json)")  # fmt: skip
    out = out.resolve()  # `.` or `..` named as the folder itself: its name and parent, not ""
    check_output_dir(out, ckpt, force=force, origin=origin)
    if not Path(origin).exists():
        raise FileNotFoundError(f"--origin-hf-dir {origin}: no such model directory or .gguf file")
    state = read_trainer_state(ckpt, flag="--to-hf")
    theirs = model_fingerprint(origin)
    if compare_model_fingerprints(str(state.model_fingerprint or ""), theirs) == "different":
        raise ExportError(f"--to-hf {ckpt} was trained from another model than --origin-hf-dir {origin} (model "
                          f"fingerprint {state.model_fingerprint} != {theirs})")  # fmt: skip
    try:
        weights = load_file(str(weights_file))
    except Exception as e:  # a truncated or foreign file
        raise ExportError(
            f"--to-hf {ckpt}: model.safetensors is unreadable ({type(e).__name__}: {e})"
        ) from None
    model = load_causal_lm(origin, dtype=torch.float32)
    tied = map_weights(model, {k: v.float() for k, v in weights.items()})
    tokenizer = load_tokenizer(origin)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o777 & ~current_umask())  # for serving, as mkdir makes it (mkdtemp's is private, 0700)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        facts = {"checkpoint": str(ckpt.resolve()), "origin": str(origin),
                 **{k: getattr(state, k) for k in ("next_rollout_id", "weight_version", "data_position", "model_fingerprint")},
                 "tied": tied, "tensor_sha256": {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                                                 for k, v in sorted(weights.items())}}  # fmt: skip
        (tmp / EXPORT_FILE).write_text(json.dumps(facts, indent=2) + "\n")
        saved = load_file(str(tmp / "model.safetensors"))
        changed = [k for k in weights if k in saved and not torch.equal(saved[k], weights[k].float())]
        if changed or not set(saved) <= set(weights) | set(tied):
            raise ExportError(
                f"the saved folder does not hold the checkpoint's tensors (first: {(changed or sorted(saved))[0]})"
            )
        positions = _verify(model, tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Export(out=out, tensors=len(weights), tied=tied, verified_positions=positions)


def _verify(model: torch.nn.Module, folder: Path) -> int:
    """Load `folder` with transformers alone and compare its log-probs with `model`'s, bitwise.

    Raises:
        ExportError: naming the prompt and the largest difference.
    """
    import transformers

    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, local_files_only=True
    )
    loaded.eval()
    vocab = int(model.config.vocab_size)
    ours, theirs = _log_probs(model, vocab), _log_probs(loaded, vocab)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not torch.equal(a, b):
            raise ExportError(f"the exported folder loads to other numbers: prompt {i}'s log-probs differ by up to "
                              f"{float((a - b).abs().max()):.3g} (not bitwise in float32)")  # fmt: skip
    return sum(len(a) for a in ours)
