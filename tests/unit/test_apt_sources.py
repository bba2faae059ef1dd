"""The lab bootstraps from the machine's own apt sources, whichever format they are in."""

from ansible_collections.sparkfleet.cluster.plugins.module_utils.apt_sources import (
    archive_mirror,
    configured_sources,
    parse_deb822,
    parse_one_line,
)

DEB822 = """Types: deb
# a snapshot of the same archive
URIs: http://archive.example.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://archive.example.test/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example.test/debian
Suites: bookworm
Components: main
"""


def test_deb822_picks_the_archive_not_security_or_sources():
    sources = parse_deb822(DEB822)
    assert [s.uri for s in sources] == ["http://archive.example.test/debian", "http://archive.example.test/debian-security"]
    assert archive_mirror("bookworm", sources) == "http://archive.example.test/debian"
    assert archive_mirror("trixie", sources) is None


def test_deb822_disabled_stanza_and_multi_line_field():
    text = ("Types: deb\nURIs: http://off.example.test/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
            "Types: deb\nURIs:\n http://on.example.test/debian\nSuites: bookworm\nComponents: contrib\n main\n")
    sources = [s for s in parse_deb822(text) if s.enabled]
    assert archive_mirror("bookworm", sources) == "http://on.example.test/debian"


def test_one_line_format_with_options():
    text = ("# comment\n"
            "deb-src http://src.example.test/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] "
            "http://one.example.test/debian bookworm main contrib\n")
    sources = parse_one_line(text)
    assert len(sources) == 1
    assert archive_mirror("bookworm", sources) == "http://one.example.test/debian"


def test_machine_configuration_order(tmp_path):
    etc = tmp_path / "etc/apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("deb http://first.example.test/debian bookworm contrib\n")
    (etc / "sources.list.d/debian.sources").write_text(DEB822)
    (etc / "sources.list.d/old.list.disabled").write_text("deb http://never.example.test/debian bookworm main\n")
    sources = configured_sources(str(tmp_path))
    assert sources[0].uri == "http://first.example.test/debian"
    assert "http://never.example.test/debian" not in [s.uri for s in sources]
    assert archive_mirror("bookworm", sources) == "http://archive.example.test/debian"
