"""A PEP 517 build backend for this one package, with the standard library
only: the machines this SDK is installed on reach no Python package index,
so `pip install ./sdk/python` must not need setuptools or wheel.

It builds a pure-Python wheel of the package directory ``warren`` (every
.py file and py.typed) with metadata from pyproject.toml's [project], an
sdist of the tree, and an editable wheel (a .pth file pointing here).
"""
from __future__ import annotations

import base64
import hashlib
import os
import tarfile
import tomllib
import zipfile
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "warren"


def _project() -> Dict[str, Any]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        p: Dict[str, Any] = tomllib.load(f)["project"]
    return p


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['description']}", f"Requires-Python: {p['requires-python']}",
             "Description-Content-Type: text/markdown", ""]
    with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
        return "\n".join(lines) + "\n" + f.read()


def _dist_info() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}.dist-info"


def _wheel_name() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}-py3-none-any.whl"


def _package_files() -> List[Tuple[str, str]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py") or name == "py.typed":
                full = os.path.join(dirpath, name)
                out.append((full, os.path.relpath(full, ROOT).replace(os.sep, "/")))
    return out


def _write_wheel(directory: str, files: List[Tuple[str, bytes]]) -> str:
    info = _dist_info()
    files = files + [
        (f"{info}/METADATA", _metadata().encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: warren-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = []
    for arc, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    name = _wheel_name()
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return name


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


get_requires_for_build_sdist = get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [(arc, _read(full)) for full, arc in _package_files()])


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    base = f"{p['name']}-{p['version']}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for rel in ["pyproject.toml", p["readme"], "_build/backend.py"]:
            tf.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        for full, arc in _package_files():
            tf.add(full, arcname=f"{base}/{arc}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        meta = _metadata().encode()
        info.size = len(meta)
        import io
        tf.addfile(info, io.BytesIO(meta))
    return name
