"""The built-in studies' options as data, so that the command parses and checks its
arguments without importing a study (or JAX).

:data:`OPTIONS` (``studies.json`` beside this file) holds, per study, its summary,
description, precision and each option's type, choices, default and help, computed from the
study classes by :func:`study_options`; after a study's fields change, rewrite it with
``python -c "from mhalearn.options import write_study_options; write_study_options()"`` (a test
fails while it is stale).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import json
import re
import textwrap
import typing
from pathlib import Path
from typing import Any, Literal

#: the options file
OPTIONS = Path(__file__).with_name("studies.json")


def plain(text: str | None) -> str:
    """A docstring as plain text: reST roles and literals unwrapped, whitespace collapsed."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).split(".")[-1], text or "")
    return " ".join(text.replace("``", "").split())


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string right after it), base classes first."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError):
            continue
        for stmt, after in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = plain(after.value.value)
    return docs


def study_options() -> dict[str, Any]:
    """What :data:`OPTIONS` holds, computed from the study classes (this imports them): the
    default study, and per study its summary, description, precision, the fields that must be
    positive or may be zero, and each option's type, choices, default and help."""
    from mhalearn.experiments import DEFAULT, STUDIES

    studies = {}
    for name, cls in STUDIES.items():
        hints, docs, defaults = typing.get_type_hints(cls), field_docs(cls), cls()
        fields = []
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            optional = type(None) in typing.get_args(kind)  # X | None: None means unset
            if optional:
                (kind,) = (a for a in typing.get_args(kind) if a is not type(None))
            many = typing.get_origin(kind) is tuple
            kind = typing.get_args(kind)[0] if many else kind
            choices = list(typing.get_args(kind)) if typing.get_origin(kind) is Literal else None
            value = getattr(defaults, f.name)
            fields.append(
                {
                    "name": f.name,
                    "type": type(choices[0]).__name__ if choices else kind.__name__,
                    "many": many,
                    "optional": optional,
                    "choices": choices,
                    "default": list(value) if many and value is not None else value,
                    "help": docs.get(f.name, ""),
                }
            )
        studies[name] = {
            "summary": cls.summary,
            "description": plain(cls.__doc__),
            "precision": cls.precision,
            "positive": list(cls.positive),
            "counts_from_zero": list(cls.counts_from_zero),
            "fields": fields,
        }
    return {"default": DEFAULT, "studies": studies}


def write_study_options() -> None:
    """Write :data:`OPTIONS` from the study classes (after a study's fields change)."""
    text = json.dumps(study_options(), indent=1, ensure_ascii=False)
    OPTIONS.write_text(text + "\n", encoding="utf-8")


@functools.cache
def options() -> dict[str, Any]:
    """The contents of :data:`OPTIONS` (read once)."""
    return json.loads(OPTIONS.read_text(encoding="utf-8"))
