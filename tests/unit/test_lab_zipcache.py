"""The lab nodes' bytecode cache for zipimport (roles/lab/files/sparkfleet_lab_zipcache.py), driven through
zipimport's own import machinery with a cache directory of the test's."""

import importlib.util
import marshal
import os
import traceback
import zipfile
import zipimport

import pytest
import sourcefile


@pytest.fixture(name="zipcache")
def fixture_zipcache(tmp_path, monkeypatch):
    module = sourcefile.load("roles/lab/files/sparkfleet_lab_zipcache.py", "sparkfleet_lab_zipcache")
    cache = tmp_path / "cache"
    original = zipimport._compile_source  # pylint: disable=protected-access
    monkeypatch.setattr(zipimport, "_compile_source",
                        lambda pathname, source: module.cached_compile(original, str(cache), pathname, source))
    return cache


def load(path, source):
    """Import module `cached_probe` from a new zip at path holding source; its module object."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("cached_probe.py", source)
    spec = zipimport.zipimporter(str(path)).find_spec("cached_probe")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = "VALUE = {value}\n\ndef fail():\n    raise ValueError('from the probe')\n"


def frames(function):
    try:
        function()
    except ValueError as err:
        return [frame.filename for frame in traceback.extract_tb(err.__traceback__)]
    raise AssertionError("the probe did not raise")


def test_a_source_seen_before_loads_from_the_cache_under_this_zips_name(zipcache, tmp_path):
    first = load(tmp_path / "first.zip", SOURCE.format(value=1))
    assert first.VALUE == 1
    (entry,) = os.listdir(zipcache)
    # The cached code is what is loaded the second time: mark it, and the mark comes back.
    marked = tmp_path / "marked.zip"
    load(marked, SOURCE.format(value=1) + "MARK = 1\n")
    os.replace(zipcache / sorted(set(os.listdir(zipcache)) - {entry})[0], zipcache / entry)
    second = load(tmp_path / "second.zip", SOURCE.format(value=1))
    assert second.MARK == 1
    # ... recorded as compiled from the zip it came from this time, nested functions too
    assert frames(second.fail)[-1] == os.path.join(str(tmp_path / "second.zip"), "cached_probe.py")


def test_a_changed_source_is_compiled_anew(zipcache, tmp_path):
    assert load(tmp_path / "a.zip", SOURCE.format(value=1)).VALUE == 1
    assert load(tmp_path / "b.zip", SOURCE.format(value=2)).VALUE == 2
    assert len(os.listdir(zipcache)) == 2


def test_a_damaged_or_unwritable_cache_falls_back_to_compiling(zipcache, tmp_path):
    assert load(tmp_path / "a.zip", SOURCE.format(value=1)).VALUE == 1
    (entry,) = os.listdir(zipcache)
    (zipcache / entry).write_bytes(b"\x00not marshal data")
    assert load(tmp_path / "b.zip", SOURCE.format(value=1)).VALUE == 1
    (zipcache / entry).write_bytes(marshal.dumps(42))  # marshal data, but no code
    assert load(tmp_path / "b2.zip", SOURCE.format(value=1)).VALUE == 1
    assert os.listdir(zipcache) == [entry]  # rewritten in place, no temporary file left
    for name in os.listdir(zipcache):  # a cache that cannot be made (a file in its place, as root too)
        os.unlink(zipcache / name)
    os.rmdir(zipcache)
    zipcache.write_bytes(b"")
    assert load(tmp_path / "c.zip", SOURCE.format(value=3)).VALUE == 3


def test_it_is_installed_once_and_for_root_only(monkeypatch):
    module = sourcefile.load("roles/lab/files/sparkfleet_lab_zipcache.py", "sparkfleet_lab_zipcache")
    original = zipimport._compile_source  # pylint: disable=protected-access
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert module.install("/nonexistent") is False
    assert zipimport._compile_source is original  # pylint: disable=protected-access
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(zipimport, "_compile_source", original)
    assert module.install("/nonexistent") is True
    assert module.install("/nonexistent") is False  # already in place
