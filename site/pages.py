"""The pages the site generates from what exists (``site/content.py``): the course map, the
exercises' index and one page per assignment, and kernelsim's API reference from its
docstrings and signatures."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from typing import TYPE_CHECKING, Any

from mkdocs.exceptions import PluginError

if TYPE_CHECKING:
    from content import Assignment, Lesson, Term  # site/content.py, loaded by site/hooks.py

log = logging.getLogger("mkdocs.hooks.pallas_course")


def _md_link(text: str, target: str) -> str:
    return f"[{text}]({target})"


def course_map_md(ls: list[Lesson], asg: list[Assignment], terms: list[Term]) -> str:
    by_lesson: dict[str, list[Assignment]] = {}
    for a in asg:
        for lesson in a.lessons:
            by_lesson.setdefault(lesson.stem, []).append(a)
    first: dict[str, str] = {}
    uses: dict[str, list[Term]] = {}
    for lesson in ls:
        found = [t for t in terms if t.pattern.search(lesson.markdown)]
        uses[lesson.stem] = found
        for t in found:
            first.setdefault(t.name, lesson.stem)
    lines = [
        "# Course map",
        "",
        f"{len(ls)} lessons, each a notebook you can read here or run in JupyterLab, and after "
        "most of them an assignment that is graded on values *and* on the kernel's block traffic. "
        "A concept in **bold** is introduced by that lesson; the others it uses again.",
        "",
        "| Lesson | Assignment | Concepts |",
        "| --- | --- | --- |",
    ]
    for lesson in ls:
        a_cell = ", ".join(_md_link(a.title, a.src_uri)
                           for a in by_lesson.get(lesson.stem, [])) or "—"
        concepts = ", ".join(
            (f"**[{t.name}](glossary.md#{t.anchor})**" if first.get(t.name) == lesson.stem
             else f"[{t.name}](glossary.md#{t.anchor})") for t in uses[lesson.stem]) or "—"
        lines.append(f"| {_md_link(lesson.nav_title, lesson.src_uri)} | {a_cell} | {concepts} |")
    orphans = [a for a in asg if not a.lessons]
    if orphans:
        lines += ["", "Assignments without a matching lesson: "
                  + ", ".join(_md_link(a.title, a.src_uri) for a in orphans) + "."]
    lines += ["", "## Where each concept appears", "",
              "| Concept | Introduced in | Used again in |", "| --- | --- | --- |"]
    titles = {lesson.stem: lesson for lesson in ls}
    for t in terms:
        where = [s for s, found in uses.items() if t in found]
        if not where:
            lines.append(f"| [{t.name}](glossary.md#{t.anchor}) | — | — |")
            continue
        intro = titles[where[0]]
        again = ", ".join(_md_link(str(titles[s].number), titles[s].src_uri)
                          for s in where[1:]) or "—"
        lines.append(f"| [{t.name}](glossary.md#{t.anchor}) | "
                     f"{_md_link(intro.nav_title, intro.src_uri)} | {again} |")
    return "\n".join(lines) + "\n"


def exercises_index_md(asg: list[Assignment]) -> str:
    lines = [
        "# Exercises",
        "",
        "The exercises are [nbgrader](https://nbgrader.readthedocs.io/) notebooks. Each task "
        "has a cell that checks your kernel on small visible cases and prints what kernelsim "
        "sees; hidden cases (other shapes, ragged edges, bfloat16, more seeds) run when the "
        "assignment is graded.",
        "",
        "Work on them in JupyterLab: `make start` copies them into your workspace "
        "(`workspace/exercises/`, never overwritten) and serves it on "
        "[127.0.0.1:8888](http://127.0.0.1:8888/lab/tree/exercises).",
        "",
    ]
    if not asg:
        lines += ["!!! note \"No assignments yet\"",
                  "    No assignment has been written yet: this page lists them as they appear "
                  "under `exercises/source/`.", ""]
        return "\n".join(lines)
    lines += ["Each assignment practises a lesson, and a later task may practise another: read "
              "them first.", "",
              "| Assignment | Practises lesson | Student notebook |", "| --- | --- | --- |"]
    for a in asg:
        lesson = ", ".join(_md_link(le.nav_title, f"../{le.src_uri}") for le in a.lessons) or "—"
        if a.later_tasks:
            lesson += f" ({a.later_tasks})"
        nb = (_md_link(a.notebook, a.download_uri.removeprefix("exercises/")) if a.release
              else "not released yet")
        lines.append(f"| {_md_link(a.title, a.name + '.md')} | {lesson} | {nb} |")
    return "\n".join(lines) + "\n"


def _demote(cell: str) -> str:
    """Headings of a statement cell, one level down (the page has its own H1)."""
    return re.sub(r"^(#{1,5}) ", r"#\1 ", cell, flags=re.MULTILINE)


def assignment_md(a: Assignment) -> str:
    lines = [f"# {a.title}", ""]
    get = ["!!! info \"Get the notebook\""]
    if a.release:
        get.append(f"    Download [{a.notebook}]({a.name}/{a.notebook}), or open "
                   f"[`exercises/{a.name}/{a.notebook}`](http://127.0.0.1:8888/lab/tree/"
                   f"exercises/{a.name}/{a.notebook}) in JupyterLab (`make start` copies it into "
                   "your workspace and serves it on 127.0.0.1:8888).")
    else:
        get.append("    The student notebook has not been released yet (nbgrader writes it to "
                   f"`exercises/release/{a.name}/{a.notebook}`); the statement below is read "
                   "from the assignment's source without its solution cells.")
    if a.lessons:
        links = [_md_link(le.nav_title, f"../{le.src_uri}") for le in a.lessons]
        get.append(f"    It practises {' and '.join(links)}.")
    lines += ["\n".join(get), ""]
    cells = list(a.statement)
    if cells and cells[0].lstrip().startswith("# "):
        cells[0] = re.sub(r"^\s*# .+\n?", "", cells[0], count=1)
    lines += [_demote(c) for c in cells if c.strip()]
    return "\n\n".join(lines) + "\n"


def lessons_list_md(ls: list[Lesson]) -> str:
    return "\n".join(f"{lesson.number}. [{lesson.title}]({lesson.src_uri})" for lesson in ls)


# --- API reference ------------------------------------------------------------------------

API_MODULES = [
    ("kernelsim", ["trace", "run"]),
    ("kernelsim.trace", ["Trace", "CallTrace"]),
    ("kernelsim.cost.schedule", ["StepEvent"]),
    ("kernelsim.cost.estimate", ["CallCost", "OperandCost"]),
    ("kernelsim.chips", ["Chip", "get_chip"]),
    ("kernelsim.backend", ["Execution", "platform", "choose"]),
    ("kernelsim.verify", ["verify", "Verification", "OperandCheck"]),
    ("kernelsim.access", ["AccessLog", "Access", "PrefetchReads"]),
    ("kernelsim.errors", ["TraceError"]),
]


_ITEM = re.compile(r"^(?:[*-] |[A-Za-z_][\w ,/()]*: )")


def doc_md(doc: str | None) -> str:
    """A docstring as markdown: ``x`` -> `x`; ``name: text`` and ``* text`` lines -> a list."""
    if not doc:
        return ""
    doc = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(doc))
    out = []
    for para in re.split(r"\n\s*\n", doc):
        items: list[str] = []
        for line in para.splitlines():
            if items and (line[:1].isspace() or not _ITEM.match(line)):
                items[-1] += " " + line.strip()
            else:
                items.append(line.strip())
        if len(items) == 1:
            out.append(items[0])
            continue
        block = [] if _ITEM.match(items[0]) else [items.pop(0), ""]
        block += ["- " + re.sub(r"^[*-] ", "", i) for i in items]
        out.append("\n".join(block))
    return "\n\n".join(out)


class _Raw(str):
    """An annotation kept as text (``from __future__ import annotations``), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def raw(a):
        return _Raw(a) if isinstance(a, str) else a

    sig = sig.replace(parameters=[p.replace(annotation=raw(p.annotation))
                                  for p in sig.parameters.values()],
                      return_annotation=raw(sig.return_annotation))
    return str(sig)


def _code(text: str) -> str:
    return f"```python\n{text}\n```"


def _members(cls: type) -> list[tuple[str, Any]]:
    members = []
    for name, value in cls.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value) or \
                isinstance(value, (classmethod, staticmethod)):
            members.append((name, value))
    return members


def api_md() -> str:
    lines = ["# kernelsim API reference", "",
             "Generated from kernelsim's docstrings and signatures when the site is built. "
             "The [guide](index.md) shows how the pieces fit together.", ""]
    for module_name, names in API_MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - report, do not hide, a broken module
            raise PluginError(f"API reference: cannot import {module_name}: {err}") from err
        lines += [f"## `{module_name}`", "", doc_md(module.__doc__), ""]
        for name in names:
            obj = getattr(module, name, None)
            if obj is None:
                log.info("API reference: %s has no %s", module_name, name)
                continue
            anchor = f"{module_name}.{name}".replace(".", "-").lower()
            if inspect.isclass(obj):
                kind = "exception" if issubclass(obj, BaseException) else "class"
                sig = "" if kind == "exception" else _signature(obj)
                doc = obj.__doc__ if obj.__doc__ and not obj.__doc__.startswith(f"{name}(") \
                    else ""
                lines += [f"### {kind} `{name}` {{#{anchor}}}", "",
                          _code(f"{kind} {name}{sig}"), "", doc_md(doc), ""]
                for mname, member in _members(obj):
                    if isinstance(member, property):
                        lines += [f"- **`{mname}`** (property)"
                                  + (f": {doc_md(member.__doc__)}" if member.__doc__ else "")]
                    else:
                        fn = member.__func__ if isinstance(member, (classmethod,
                                                                    staticmethod)) else member
                        doc = doc_md(fn.__doc__).replace("\n", "\n    ")
                        lines += [f"- **`{mname}{_signature(fn)}`**"
                                  + (f"\n\n    {doc}\n" if doc else "")]
                lines.append("")
            else:
                lines += [f"### `{name}` {{#{anchor}}}", "", _code(f"{name}{_signature(obj)}"),
                          "", doc_md(obj.__doc__), ""]
    lines += chips_md()
    lines += cli_md()
    return "\n".join(lines) + "\n"


def chips_md() -> list[str]:
    from kernelsim.chips import CHIPS  # importing kernelsim starts JAX: the API page's alone

    lines = ["## Chips (`kernelsim.chips.CHIPS`) {#chips}", "",
             "| name | kind | bf16 peak (TFLOP/s) | f32 peak (TFLOP/s) | HBM (GB/s) | "
             "on-chip (VMEM / shared) | SMEM | ridge (FLOP/byte) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for chip in CHIPS.values():
        lines.append(
            f"| `{chip.name}` | {chip.kind} | {chip.peak_flops_bf16 / 1e12:g} | "
            f"{chip.peak_flops_f32 / 1e12:g} | {chip.hbm_bytes_per_second / 1e9:g} | "
            f"{_bytes(chip.vmem_bytes)} | {_bytes(chip.smem_bytes)} | "
            f"{chip.ridge_flops_per_byte:.0f} |")
    lines += ["", "Sources of these numbers:", ""]
    for chip in CHIPS.values():
        lines.append(f"- `{chip.name}`: " + "; ".join(chip.sources))
    return lines + [""]


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def cli_md() -> list[str]:
    from kernelsim import cli  # importing kernelsim starts JAX: the API page's alone

    parser = cli._parser()
    lines = ["## Command line (`kernelsim`)", "", "```text", parser.format_help().rstrip(),
             "```", ""]
    for action in parser._subparsers._group_actions:  # argparse keeps subparsers here
        for name, sub in action.choices.items():
            lines += [f"### `kernelsim {name}`", "", "```text", sub.format_help().rstrip(),
                      "```", ""]
    return lines
