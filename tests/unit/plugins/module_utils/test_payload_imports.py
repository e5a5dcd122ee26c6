"""payload_imports.CompileOnce: modules below a zip get zipimport's spec and are compiled once, not twice."""

import builtins
import importlib
import sys
import zipfile
import zipimport

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import payload_imports

PKG = "payload_imports_probe"


@pytest.fixture
def payload(tmp_path, monkeypatch):
    """A zip with package PKG (module `engine`, subpackage `room` with module `writer`) on sys.path, PKG
    imported; compiles of its files are counted by file name. Yields (archive, counts)."""
    archive = str(tmp_path / "payload.zip")
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(PKG + "/__init__.py", "")
        zf.writestr(PKG + "/engine.py", "from %s.room import writer\nVALUE = writer.VALUE + 1\n" % PKG)
        zf.writestr(PKG + "/room/__init__.py", "")
        zf.writestr(PKG + "/room/writer.py", "VALUE = 41\n")
    monkeypatch.syspath_prepend(archive)
    counts, real = {}, builtins.compile

    def counting(source, filename, *args, **kwargs):
        if str(filename).startswith(archive):
            counts[filename[len(archive) + 1:]] = counts.get(filename[len(archive) + 1:], 0) + 1
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", counting)
    importlib.import_module(PKG)
    counts.clear()
    yield archive, counts
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
        del sys.modules[name]


def test_zipimport_alone_compiles_each_module_twice(payload):
    # why the finder exists: find_spec -> get_filename compiles, exec_module compiles again
    archive, counts = payload
    assert importlib.import_module(PKG + ".engine").VALUE == 42
    assert counts == {PKG + "/engine.py": 2, PKG + "/room/__init__.py": 2, PKG + "/room/writer.py": 2}


def test_with_the_finder_each_module_is_compiled_once_with_zipimports_spec(payload, monkeypatch):
    archive, counts = payload
    monkeypatch.setattr(sys, "meta_path", [payload_imports.CompileOnce(archive)] + sys.meta_path)
    engine = importlib.import_module(PKG + ".engine")
    assert engine.VALUE == 42
    assert counts == {PKG + "/engine.py": 1, PKG + "/room/__init__.py": 1, PKG + "/room/writer.py": 1}
    room = sys.modules[PKG + ".room"]
    assert engine.__file__ == "%s/%s/engine.py" % (archive, PKG)
    assert room.__file__ == "%s/%s/room/__init__.py" % (archive, PKG)
    assert room.__path__ == ["%s/%s/room" % (archive, PKG)]
    assert isinstance(engine.__loader__, zipimport.zipimporter)
    assert engine.__loader__.get_source(engine.__name__).startswith("from ")   # what cli_zipapp reads


def test_the_finder_leaves_other_names_to_the_import_system(payload):
    archive, counts = payload
    finder = payload_imports.CompileOnce(archive)
    assert finder.find_spec(PKG + ".missing", ["%s/%s" % (archive, PKG)]) is None
    assert finder.find_spec("json.decoder", sys.modules["json"].__path__) is None
    assert finder.find_spec(PKG, None) is None


def test_install_does_nothing_where_the_collection_was_not_imported_from_a_zip(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    payload_imports.install()
    assert not any(isinstance(finder, payload_imports.CompileOnce) for finder in sys.meta_path)
