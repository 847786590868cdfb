"""Expert knowledge as data: principles (markdown), hardware profiles and tuning tables (YAML),
Triton kernel templates (Python). Every file is validated by a schema of knowledge.schema on load.
"""
from __future__ import annotations

import functools
import pathlib
import re

import yaml

from knowledge.schema import ConfigSpace, HardwareProfile, Principle

ROOT = pathlib.Path(__file__).resolve().parent


class KnowledgeError(ValueError):
    pass


def _front_matter(path: pathlib.Path) -> tuple[dict, str]:
    text = path.read_text()
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    if not m:
        raise KnowledgeError(f"{path.name}: missing '---' front matter")
    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError as e:
        raise KnowledgeError(f"{path.name}: front matter is not valid YAML: {e}") from None
    return meta, m.group(2)


def _sections(body: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(r"^## (.+?)\n(.*?)(?=^## |\Z)", body, re.S | re.M):
        out[m.group(1).strip().lower()] = m.group(2).strip()
    return out


@functools.lru_cache(maxsize=None)
def principles() -> dict[str, Principle]:
    """All principles by id."""
    out: dict[str, Principle] = {}
    for path in sorted((ROOT / "principles").glob("*.md")):
        meta, body = _front_matter(path)
        sec = _sections(body)
        try:
            p = Principle(
                id=meta.get("id", path.stem), stage=meta.get("stage"), title=meta.get("title"),
                applies_to=meta.get("applies_to", []), why=sec.get("why", ""),
                when=sec.get("when to apply", ""), impact=sec.get("expected impact", ""),
                risks=sec.get("risks", ""),
            )
        except Exception as e:  # pydantic error -> one line naming the file
            raise KnowledgeError(f"{path.name}: {e}") from None
        if p.id != path.stem:
            raise KnowledgeError(f"{path.name}: id {p.id!r} differs from the file name")
        if not (p.why and p.when and p.impact and p.risks):
            raise KnowledgeError(f"{path.name}: needs Why / When to apply / Expected impact / Risks")
        out[p.id] = p
    return out


def principle(pid: str) -> Principle:
    try:
        return principles()[pid]
    except KeyError:
        raise KnowledgeError(f"unknown principle id {pid!r}") from None


def principles_for(stage: str, applies_to: list[str] | None = None) -> list[Principle]:
    """The principles of a stage, narrowed to those that apply to the given op kinds."""
    want = set(applies_to or [])
    out = []
    for p in principles().values():
        if p.stage != stage:
            continue
        if want and p.applies_to and not (want & set(p.applies_to)):
            continue
        out.append(p)
    return out


@functools.lru_cache(maxsize=None)
def hardware_profiles() -> dict[str, HardwareProfile]:
    out = {}
    for path in sorted((ROOT / "hardware").glob("*.yaml")):
        try:
            hp = HardwareProfile(**yaml.safe_load(path.read_text()))
        except Exception as e:
            raise KnowledgeError(f"{path.name}: {e}") from None
        out[hp.id] = hp
    return out


def match_hardware(device_name: str) -> HardwareProfile | None:
    """The profile whose match strings occur in the device name (longest match wins)."""
    best, best_len = None, -1
    low = device_name.lower()
    for hp in hardware_profiles().values():
        for s in hp.match:
            if s.lower() in low and len(s) > best_len:
                best, best_len = hp, len(s)
    return best


@functools.lru_cache(maxsize=None)
def config_spaces() -> dict[tuple[str, str, str], ConfigSpace]:
    """Every tuning space of knowledge/tuning/*.yaml by (template, arch, dtype).

    A file may give ``arch`` (and ``source``) once at its top; each entry of ``spaces`` inherits
    them unless it names its own.
    """
    out: dict[tuple[str, str, str], ConfigSpace] = {}
    for path in sorted((ROOT / "tuning").glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise KnowledgeError(f"{path.name}: not valid YAML: {e}") from None
        for i, entry in enumerate(doc.get("spaces", [])):
            entry = {**{k: doc[k] for k in ("arch", "source") if k in doc}, **entry}
            try:
                cs = ConfigSpace(**entry)
            except Exception as e:
                raise KnowledgeError(f"{path.name}: space {i} ({entry.get('template')}): {e}") from None
            key = (cs.template, cs.arch, cs.dtype)
            if key in out:
                raise KnowledgeError(f"{path.name}: a second space for {key}")
            out[key] = cs
    return out


def config_space(template: str, arch: str, dtype: str | None = None) -> ConfigSpace | None:
    """The tuning space of a template on an architecture for an element type.

    Most specific first: (arch, dtype), (arch, any), (any, dtype), (any, any); None when the
    template has no table.
    """
    from knowledge.schema import dtype_key

    spaces = config_spaces()
    d = dtype_key(dtype)
    for key in ((template, arch, d), (template, arch, "any"), (template, "any", d),
                (template, "any", "any")):
        if key in spaces:
            return spaces[key]
    return None
