"""`grpolab check turns RECORDING... [--hf-checkpoint M] [--json]`: the drift auditor over recordings.

Every multi-turn sample of the recordings (`.grz`, written by `--save-debug-rollout-data`) is audited
by `checkers/turns.py` with the checkpoint's chat template: per sample, the first divergent token of
each turn boundary whose ids are not the template's, both id lists and their text, the cause, and the
mask invariants; drift hazards (ids a re-tokenising trainer would not reproduce) are listed apart.
The tokenizer is `--hf-checkpoint`'s, else the recording run's own (its run.json), checked against
the recording's tokenizer fingerprint. Exit 0: clean (drift hazards allowed); 1: a broken turn
boundary or invariant; 2: bad input (a file that is not a recording, no multi-turn sample, no
tokenizer, a tokenizer other than the recording's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PROG = "grpolab check turns"


def _checkpoint(given: str | None, run_dir: str, where: str) -> str:
    """`--hf-checkpoint`, else the recording run's own (its run.json, relative paths by its cwd)."""
    if given:
        return given
    from grpolab.core.config.paths import resolve_config_paths
    from grpolab.rundir import reader

    try:
        meta = reader.read_run_meta(run_dir) if run_dir else None
    except (reader.RunDirError, OSError):
        meta = None
    model = meta.model if meta else None
    if meta is None or model is None:
        raise ValueError(
            f"{where}: its run's run.json is not at {run_dir or '(no run dir recorded)'}; pass --hf-checkpoint"
        )
    cwd = meta.raw.get("cwd")
    if isinstance(cwd, str) and os.path.isabs(cwd):
        model = resolve_config_paths({"model": {"hf_checkpoint": model}}, cwd)["model"]["hf_checkpoint"]
    return model


def run_turns_command(args: argparse.Namespace) -> int:
    """Run `grpolab check turns`; return the exit code (see the module docstring)."""
    from grpolab.checkers.turns import audit_samples
    from grpolab.core.modeling import load_tokenizer
    from grpolab.replay.fingerprints import tokenizer_fingerprint
    from grpolab.replay.format import RecordingError
    from grpolab.replay.recording import load_rollout

    audits, tokenizers = [], {}
    try:
        for path in args.recordings:
            if not Path(path).is_file():
                raise ValueError(f"{path}: no such file")
            rec = load_rollout(path)
            model = _checkpoint(args.hf_checkpoint, rec.run_dir, path)
            if model not in tokenizers:
                tokenizers[model] = load_tokenizer(model)
            tok = tokenizers[model]
            if rec.tokenizer_fingerprint and tokenizer_fingerprint(tok) != rec.tokenizer_fingerprint:
                raise ValueError(
                    f"{path}: recorded with another tokenizer than {model}'s (fingerprints differ)"
                )
            audits += [(path, a) for a in audit_samples(rec.samples, tok)]
    except (ValueError, FileNotFoundError, RecordingError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if not audits:
        print(f"{PROG}: error: no multi-turn sample in {', '.join(args.recordings)}", file=sys.stderr)
        return 2
    errors = [(p, f) for p, a in audits for f in a.findings if f.severity == "error"]
    drift = [(p, f) for p, a in audits for f in a.findings if f.severity == "drift"]
    if args.json:
        print(json.dumps({
            "samples": len(audits), "turns": sum(a.turns for _, a in audits), "ok": not errors,
            "errors": [{"recording": p, **f.as_json()} for p, f in errors],
            "drift": [{"recording": p, **f.as_json()} for p, f in drift],
            "trainable_per_turn": [{"recording": p, "sample": a.sample, "tokens": a.trainable_per_turn} for p, a in audits],
        }))  # fmt: skip
        return 1 if errors else 0
    print(report(audits, errors, drift))
    return 1 if errors else 0


def report(audits: list, errors: list, drift: list) -> str:
    """The text report: totals, then each broken sample's first finding per turn, then drift hazards."""
    turns = sum(a.turns for _, a in audits)
    lines = [f"{PROG}: {len(audits)} multi-turn samples, {turns} model turns"]
    if not errors:
        lines.append("turn boundaries: every boundary holds the chat template's ids; mask invariants hold")
    else:
        broken = {(p, f.sample) for p, f in errors}
        lines.append(
            f"FAIL: {len(errors)} problems in {len(broken)} of {len(audits)} samples (the first 10):"
        )
        for p, f in errors[:10]:
            lines.append(f"  {p} sample {f.sample} turn {f.turn}: {f.cause}: {f.detail}")
            if f.position >= 0:
                lines.append(f"    first divergent response token {f.position}:")
                lines.append(f"      recorded {f.recorded} {f.recorded_text!r}")
                lines.append(f"      template {f.expected} {f.expected_text!r}")
    if drift:
        causes = sorted({f.cause for _, f in drift})
        lines.append(
            f"drift hazards ({len(drift)} turn{'s' if len(drift) != 1 else ''}: {', '.join(causes)}): the record "
            "keeps the sampled ids, but a "
            "trainer that re-tokenises the history would train on other ids there"
        )
    return "\n".join(lines)
