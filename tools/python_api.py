#!/usr/bin/env python3
"""The Python API reference: checks that every public name of the slimserve package is
documented, then renders the reference from the docstrings with pdoc.

    python tools/python_api.py --check               # list public names without documentation
    python tools/python_api.py --output build/python-api   # check, then write the HTML

A name is documented by its docstring, by a section of docs/python-api.md (a `### \`name\``
heading; its text is appended to the docstring under "Shapes and dtypes"), or both; a section
naming something that is not public is an error too (the reference would silently lose it), and
so is an entry taking tensors (TENSOR_PARAMETERS) whose documentation gives no shape ("[...]").

Public: the names `slimserve`, `slimserve.attention`, `slimserve.moe`, `slimserve.kv_transfer` and
`slimserve.nixl` export (their
`__all__`, or for `slimserve` every name without a leading underscore that it defines or
re-exports from its own submodules), the `torch.library` ops of `slimserve.torch_ops`, and every
public method and property of the public classes. Runs with the interpreter that has the
package (and PyTorch, for the ops) importable; SLIMSERVE_LIBRARY as for the package.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NOTES = os.path.join(ROOT, "docs", "python-api.md")
MODULES = ["slimserve", "slimserve.attention", "slimserve.moe", "slimserve.torch_ops", "slimserve.kv_transfer",
           "slimserve.nixl"]


def read_notes(path: str = NOTES) -> dict:
    """`### `name`` sections of docs/python-api.md: qualified name -> Markdown text."""
    with open(path) as f:
        text = f.read()
    notes = {}
    parts = re.split(r"^### `([\w.]+)`\s*$", text, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2]):
        notes[name] = re.split(r"^#", body, maxsplit=1, flags=re.M)[0].strip()
    return notes


def is_op(value) -> bool:
    return type(value).__name__ == "CustomOpDef"  # torch.library.custom_op


def public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", "").startswith("slimserve")
                 and (inspect.isclass(v) or inspect.isfunction(v))]
    return sorted(names)


def members(cls):
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if name == "__init__":
            continue  # documented by the class docstring
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            yield name, value


def public_objects():
    """(qualified name, object, owner module) of every public name, classes' members included."""
    found = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            if module_name == "slimserve.torch_ops":
                print(f"python_api: {module_name} not checked ({error})", file=sys.stderr)
                continue
            raise
        found.append((module_name, module, module))
        names = public_names(module) + [n for n, v in vars(module).items() if not n.startswith("_") and is_op(v)]
        for name in sorted(set(names)):
            value = getattr(module, name)
            defined_in = getattr(value, "__module__", module_name)
            if defined_in != module_name and defined_in in MODULES:
                continue  # documented where it is defined
            found.append((f"{module_name}.{name}", value, module))
            if inspect.isclass(value):
                for member, function in members(value):
                    found.append((f"{module_name}.{name}.{member}", function, module))
    return found


def own_doc(value) -> str:
    if is_op(value):
        value = getattr(value, "_init_fn", None)  # the decorated function
    return (getattr(value, "__doc__", None) or "").strip()


# Parameters that take tensors: an entry with one of them must give shapes ("[...]").
TENSOR_PARAMETERS = {
    "q", "k", "v", "out", "lse", "key", "value", "key_cache", "value_cache", "k_cache", "v_cache",
    "slot_mapping", "k_pages", "v_pages", "indptr", "indices", "last_page_len", "qo_indptr",
    "kv_indptr", "kv_indices", "block_table", "seq_lens", "expected_tags", "a", "packed", "scales",
    "zeros", "bias", "topk_ids", "topk_weights", "latent", "rope", "pages", "weight", "chunk_k",
    "chunk_v", "sinks", "append_indptr", "token_request", "token_position", "paged_kv_cache"}


def tensor_parameters(value):
    function = getattr(value, "_init_fn", value) if is_op(value) else value
    if inspect.isclass(function):
        function = vars(function).get("__init__")
    if not inspect.isfunction(function):
        return []
    return [p for p in inspect.signature(function).parameters if p in TENSOR_PARAMETERS]


def undocumented(found, notes):
    """(names without documentation, names whose tensor arguments get no shape, stale notes)."""
    names = {name for name, _, _ in found}
    missing = [name for name, value, _ in found if not own_doc(value) and name not in notes]
    shapeless = [name for name, value, _ in found if tensor_parameters(value)
                 and name not in missing and "[" not in own_doc(value) + notes.get(name, "")]
    stale = sorted(set(notes) - names)
    return missing, shapeless, stale


def attach_notes(found, notes) -> None:
    """Appends each section of docs/python-api.md to its name's docstring (ops: to their module's)."""
    for name, value, module in found:
        note = notes.get(name)
        if not note:
            continue
        text = f"{own_doc(value)}\n\n**Shapes and dtypes.** {note}".strip()
        if is_op(value):
            module.__doc__ = f"{module.__doc__}\n\n### `{name.rsplit('.', 1)[1]}`\n\n{text}"
        elif isinstance(value, property) or inspect.isfunction(value) or inspect.isclass(value):
            value.__doc__ = text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the docstrings")
    parser.add_argument("--output", help="folder for the HTML reference")
    args = parser.parse_args()
    found, notes = public_objects(), read_notes()
    missing, shapeless, stale = undocumented(found, notes)
    for name in missing:
        print(f"python_api: {name} has no docstring and no section in docs/python-api.md", file=sys.stderr)
    for name in shapeless:
        print(f"python_api: {name} takes tensors ({', '.join(tensor_parameters(dict((n, v) for n, v, _ in found)[name]))}) "
              "but neither its docstring nor docs/python-api.md gives a shape", file=sys.stderr)
    for name in stale:
        print(f"python_api: docs/python-api.md documents {name}, which is not public", file=sys.stderr)
    if missing or shapeless or stale:
        return 1
    print(f"python_api: {len(found)} public names documented ({len(notes)} with notes from docs/python-api.md)")
    if args.output and not args.check:
        import pdoc  # noqa: E402  (only for rendering)
        from pathlib import Path

        attach_notes(found, notes)
        pdoc.render.configure(docformat="markdown", search=False)
        private = sorted({f"!{name}" for name in sys.modules
                          if name.startswith("slimserve._") or ("._" in name and name.startswith("slimserve."))})
        # slimserve.vllm imports vLLM, which lives in its own environment (docs/vllm.md documents
        # the plugin); the reference covers the package an engine calls.
        pdoc.pdoc("slimserve", "!slimserve.vllm", *private, output_directory=Path(args.output))
        pages = sum(name.endswith(".html") for _, _, files in os.walk(args.output) for name in files)
        print(f"python_api: {pages} pages in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
