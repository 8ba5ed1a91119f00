"""Finding cuobjdump/nvdisasm and turning objects into sm_90a SASS text (cached by content)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ARCH = "sm_90a"


class ToolError(RuntimeError):
    pass


def _candidates(name: str, extra_dirs: list[Path]) -> list[Path]:
    out = []
    env = os.environ.get("SLIMSERVE_" + name.upper())
    if env:
        out.append(Path(env))
    for directory in extra_dirs:
        out.append(directory / name)
    found = shutil.which(name)
    if found:
        out.append(Path(found))
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    out.append(Path(cuda) / "bin" / name)
    return out


def find_tool(name: str, extra_dirs: list[Path]) -> Path:
    for candidate in _candidates(name, extra_dirs):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolError(
        f"{name} not found (looked in {', '.join(str(d) for d in extra_dirs) or '-'}, PATH and "
        f"the CUDA toolkit). scripts/install-deps installs it from PyPI "
        f"(nvidia-cuda-{'cuobjdump' if name == 'cuobjdump' else 'nvdisasm'}); or set "
        f"SLIMSERVE_{name.upper()}.")


@dataclass
class Tools:
    cuobjdump: Path
    nvdisasm: Path

    @classmethod
    def locate(cls, extra_dirs: list[Path]) -> "Tools":
        return cls(find_tool("cuobjdump", extra_dirs), find_tool("nvdisasm", extra_dirs))


def _run(command: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


_RESOURCE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass
class Resources:
    registers: int
    stack: int
    shared: int  # static shared memory, as the cubin records it
    local: int


@dataclass
class ObjectSass:
    path: Path
    sass: str  # nvdisasm -c -g output of the sm_90a cubin ("" when the object has none)
    resources: dict[str, Resources]


def _disassemble(tools: Tools, path: Path) -> tuple[str, str]:
    listing = _run([str(tools.cuobjdump), "-lelf", str(path)])
    names = [line.split(":", 1)[1].strip() for line in listing.splitlines()
             if line.startswith("ELF file") and ARCH in line]
    if not names:
        return "", ""
    with tempfile.TemporaryDirectory(prefix="sass-report-") as scratch:
        _run([str(tools.cuobjdump), "-xelf", names[0], str(path.resolve())], cwd=Path(scratch))
        cubin = Path(scratch) / names[0]
        sass = _run([str(tools.nvdisasm), "-c", "-g", str(cubin)])
        resources = _run([str(tools.cuobjdump), "-res-usage", str(cubin)])
    return sass, resources


def load_objects(tools: Tools, paths: list[Path], cache_dir: Path | None) -> list[ObjectSass]:
    """SASS of every object that carries sm_90a code, disassembled in parallel and cached."""

    def one(path: Path) -> ObjectSass:
        data = path.read_bytes()
        key = hashlib.sha256(data + str(tools.nvdisasm).encode()).hexdigest()[:24]
        sass_file = resources_file = None
        if cache_dir is not None:
            sass_file = cache_dir / f"{key}.sass"
            resources_file = cache_dir / f"{key}.res"
        if sass_file is not None and sass_file.exists() and resources_file.exists():
            sass, resources = sass_file.read_text(), resources_file.read_text()
        else:
            sass, resources = _disassemble(tools, path)
            if sass_file is not None:
                cache_dir.mkdir(parents=True, exist_ok=True)
                sass_file.write_text(sass)
                resources_file.write_text(resources)
        table = {m.group(1): Resources(int(m.group(2)), int(m.group(3)), int(m.group(4)),
                                       int(m.group(5)))
                 for m in _RESOURCE.finditer(resources)}
        return ObjectSass(path, sass, table)

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, paths))


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled names through c++filt (binutils); identity when it is missing."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return {name: name for name in names}
    result = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) != len(names):
        return {name: name for name in names}
    return dict(zip(names, lines))
