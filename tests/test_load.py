"""The loader: plain data, a position for every key and item, and every problem of a file
reported at once with its exact text. Positions below were counted by hand (1-based)."""

import time
from types import MappingProxyType

import pytest
import yaml

from compiler.errors import MemspecError
from compiler.pipeline.load import Document, child_path, load_yaml, load_yaml_text

LIBYAML = getattr(yaml, "__with_libyaml__", False)


def rendered(text: str, file: str = "x.yaml") -> str:
    with pytest.raises(MemspecError) as caught:
        load_yaml_text(text, file)
    return caught.value.render()


# --------------------------------------------------------------------------- data and positions


def test_data_and_positions():
    doc = load_yaml_text(
        "name: llava\n"  # line 1
        "modules:\n"  # line 2
        "  language:\n"  # line 3
        "    layers: 32\n"  # line 4: key at col 5
        "trainable:\n"  # line 5
        "  - language.q_proj\n"  # line 6: item at col 5
        "  - {a: 1, 'b c': 2}\n",  # line 7: item at col 5, a at col 6, 'b c' at col 12
        "x.yaml",
    )
    assert doc.data == {"name": "llava", "modules": {"language": {"layers": 32}}, "trainable": ["language.q_proj", {"a": 1, "b c": 2}]}
    assert dict(doc.positions) == {
        "$": (1, 1),
        "$.name": (1, 1),
        "$.modules": (2, 1),
        "$.modules.language": (3, 3),
        "$.modules.language.layers": (4, 5),
        "$.trainable": (5, 1),
        "$.trainable[0]": (6, 5),
        "$.trainable[1]": (7, 5),
        "$.trainable[1].a": (7, 6),
        "$.trainable[1]['b c']": (7, 12),
    }


def test_where_falls_back_to_nearest_ancestor():
    doc = load_yaml_text("a:\n  b: [1, 2]\n", "x.yaml")
    assert doc.where("$.a.b[1]") == (2, 10)
    assert doc.where("$.a.b[7].c") == (2, 3)  # no item 7: its list's key
    assert doc.where("$.a.missing") == (1, 1)
    assert doc.where("$.zzz['q r'][0]") == (1, 1)
    assert doc.where("$") == (1, 1)
    assert doc.where("") == (1, 1)


def test_where_understands_quoted_steps():
    doc = load_yaml_text("\"it's\":\n  'a.b': [x]\n", "x.yaml")
    path = child_path(child_path(child_path("$", "it's"), "a.b"), 0)
    assert path == "$['it\\'s']['a.b'][0]"
    assert doc.where(path) == (2, 11)
    assert doc.where(path + ".deeper") == (2, 11)


def test_diag_is_located():
    doc = load_yaml_text("a:\n  hidden: 4096\n", "specs/m.yaml")
    d = doc.diag("E204", "$.a.hidden", "must be <= 1024, got 4096")
    assert d.render() == "specs/m.yaml:2:3: E204 $.a.hidden: must be <= 1024, got 4096"


def test_document_is_frozen():
    doc = load_yaml_text("a: 1\n", "x.yaml")
    assert isinstance(doc, Document)
    with pytest.raises(AttributeError):
        doc.file = "y.yaml"  # type: ignore[misc]
    assert isinstance(doc.positions, MappingProxyType)


@pytest.mark.parametrize(
    "parent, key, expected",
    [
        ("$", "modules", "$.modules"),
        ("$.modules", "language", "$.modules.language"),
        ("$", 0, "$[0]"),
        ("$.trainable", 3, "$.trainable[3]"),
        ("$", "a b", "$['a b']"),
        ("$", "bytes.param", "$['bytes.param']"),
        ("$", "q-proj", "$['q-proj']"),
        ("$", "1st", "$['1st']"),
        ("$", "it's", "$['it\\'s']"),
        ("$", "_x9", "$._x9"),
    ],
)
def test_child_path(parent, key, expected):
    assert child_path(parent, key) == expected


# --------------------------------------------------------------------------- scalars


def test_underscored_integers_are_ints():
    # YAML 1.1 (PyYAML's SafeLoader) and this loader agree on this one.
    assert yaml.safe_load("n: 7_063_427_072") == {"n": 7063427072}
    assert load_yaml_text("n: 7_063_427_072\n", "x.yaml").data == {"n": 7063427072}


def test_scalars_follow_yaml_1_2_core():
    doc = load_yaml_text(
        "i: 4096\nneg: -3\nhex: 0x1F\nzero: 0\n"
        "f: 0.5\nexp: 1e-4\nexp2: 2.5E+3\ninf: .inf\n"
        "t: true\nt2: True\nf2: false\n"
        "n1: null\nn2: ~\nn3:\n"
        "s: hello\nq: '123'\nyq: 'yes'\ndate: 2024-01-01\nsexagesimal: 1:20\n",
        "x.yaml",
    )
    assert doc.data == {
        "i": 4096,
        "neg": -3,
        "hex": 31,
        "zero": 0,
        "f": 0.5,
        "exp": 0.0001,
        "exp2": 2500.0,
        "inf": float("inf"),
        "t": True,
        "t2": True,
        "f2": False,
        "n1": None,
        "n2": None,
        "n3": None,
        "s": "hello",
        "q": "123",
        "yq": "yes",
        "date": "2024-01-01",
        "sexagesimal": "1:20",
    }
    assert type(doc.data["i"]) is int and type(doc.data["t"]) is bool


# --------------------------------------------------------------------------- E101 file


def test_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MemspecError) as caught:
        load_yaml("specs/nope.yaml")
    assert caught.value.render() == (f"specs/nope.yaml: E101 file not found\nhelp: looked for {tmp_path.resolve() / 'specs' / 'nope.yaml'}")
    d = caught.value.diagnostics[0]
    assert (d.file, d.line, d.col, d.path) == ("specs/nope.yaml", 0, 0, "")


def test_directory_is_not_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    with pytest.raises(MemspecError) as caught:
        load_yaml("specs")
    assert caught.value.render() == (f"specs: E101 is a directory, not a file\nhelp: give the path of a YAML file (in {tmp_path.resolve() / 'specs'})")


def test_load_from_file_keeps_the_path_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_bytes("\ufeffa: 1\n".encode("utf-8"))  # a BOM is fine
    doc = load_yaml("m.yaml")
    assert (doc.file, doc.data) == ("m.yaml", {"a": 1})
    assert load_yaml(tmp_path / "m.yaml").file == str(tmp_path / "m.yaml")


# --------------------------------------------------------------------------- E102 syntax


def test_invalid_utf8(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(MemspecError) as caught:
        load_yaml("bad.yaml")
    assert caught.value.render() == "bad.yaml:2:7: E102 file is not valid UTF-8\nhelp: save the file as UTF-8"


@pytest.mark.skipif(not LIBYAML, reason="messages are libyaml's")
def test_syntax_error():
    assert rendered("a: b: c\n") == "x.yaml:1:5: E102 mapping values are not allowed in this context"
    assert rendered("a: [1, 2\n") == ("x.yaml:2:1: E102 did not find expected ',' or ']'\nhelp: while parsing a flow sequence at line 1")


@pytest.mark.skipif(not LIBYAML, reason="messages are libyaml's")
def test_tab_indentation():
    assert rendered("a:\n\t- x\n") == ("x.yaml:2:1: E102 found character that cannot start any token\nhelp: indent with spaces, not tabs")


def test_control_characters():
    with pytest.raises(MemspecError) as caught:
        load_yaml_text("a: 1\nb: '\x07'\n", "x.yaml")
    (d,) = caught.value.diagnostics
    assert (d.code, d.line, d.col) == ("E102", 2, 5)
    assert d.message.startswith("unacceptable character #x0007: ")  # the rest is the parser's words


def test_syntax_error_is_located():
    with pytest.raises(MemspecError) as caught:
        load_yaml_text("ok: 1\nbad: 'unterminated\n", "x.yaml")
    (d,) = caught.value.diagnostics
    assert (d.code, d.line) == ("E102", 3)


# --------------------------------------------------------------------------- E103 duplicates


def test_all_duplicate_keys_are_reported():
    assert rendered(
        "hidden: 1\n"  # line 1
        "layers: 2\n"
        "hidden: 3\n"  # line 3: second 'hidden'
        "vision:\n"
        "  heads: 4\n"  # line 5
        "  heads: 5\n"  # line 6: second 'heads', col 3
        "  heads: 6\n"  # line 7: third
    ) == (
        "x.yaml:3:1: E103 $.hidden: duplicate key 'hidden'\n"
        "help: first defined at line 1\n"
        "\n"
        "x.yaml:6:3: E103 $.vision.heads: duplicate key 'heads'\n"
        "help: first defined at line 5\n"
        "\n"
        "x.yaml:7:3: E103 $.vision.heads: duplicate key 'heads'\n"
        "help: first defined at line 5\n"
        "\n"
        "3 errors"
    )


# --------------------------------------------------------------------------- E104 anchors

NO_ANCHORS = "help: write the value out in full: anchors and aliases hide what a reviewed file says"


def test_anchors_aliases_and_merge_keys_are_rejected():
    assert (
        rendered(
            "base: &b {hidden: 1}\n"  # anchor at col 7
            "copy: *b\n"  # alias at col 7
            "child:\n"
            "  <<: *b\n"  # merge key at col 3 (its alias is not reported again)
            "  hidden: 2\n"
        )
        == (
            "x.yaml:1:7: E104 $.base: anchor '&b' is not allowed\n" + NO_ANCHORS + "\n"
            "\n"
            "x.yaml:2:7: E104 $.copy: alias '*b' is not allowed\n" + NO_ANCHORS + "\n"
            "\n"
            "x.yaml:4:3: E104 $.child: merge key '<<' is not allowed\n" + NO_ANCHORS + "\n"
            "\n"
            "3 errors"
        )
    )


def test_alias_in_a_list():
    assert rendered("a: &x 1\nb: [*x]\n") == (
        "x.yaml:1:4: E104 $.a: anchor '&x' is not allowed\n" + NO_ANCHORS + "\n"
        "\n"
        "x.yaml:2:5: E104 $.b[0]: alias '*x' is not allowed\n" + NO_ANCHORS + "\n"
        "\n"
        "2 errors"
    )


# --------------------------------------------------------------------------- E105 keys


def test_non_string_keys():
    assert rendered("1: x\nsub:\n  true: y\n  ~: z\n[a]: 1\n") == (
        "x.yaml:1:1: E105 $: mapping key 1 is not a string\n"
        "help: quote it if you mean the string: '1'\n"
        "\n"
        "x.yaml:3:3: E105 $.sub: mapping key true is not a string\n"
        "help: quote it if you mean the string: 'true'\n"
        "\n"
        "x.yaml:4:3: E105 $.sub: mapping key ~ is not a string\n"
        "help: quote it if you mean the string: '~'\n"
        "\n"
        "x.yaml:5:1: E105 $: mapping keys must be strings, not a list\n"
        "\n"
        "4 errors"
    )


def test_quoted_keys_are_strings():
    assert load_yaml_text("'1': x\n\"true\": y\n", "x.yaml").data == {"1": "x", "true": "y"}


# --------------------------------------------------------------------------- E106 / E107 documents


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_document(text):
    assert rendered(text) == "x.yaml:1:1: E106 empty document\nhelp: a memspec file is a YAML mapping"


def test_multiple_documents():
    assert rendered("a: 1\n---\nb: 2\n---\nc: 3\n") == ("x.yaml:2:1: E107 more than one YAML document in the file\nhelp: put each document in its own file")


def test_one_explicit_document_is_fine():
    assert load_yaml_text("---\na: 1\n...\n", "x.yaml").data == {"a": 1}


# --------------------------------------------------------------------------- E108-E110 scalars


def test_ambiguous_booleans():
    assert rendered("a: yes\nb: [no, On]\non: 1\n") == (
        "x.yaml:1:4: E108 $.a: ambiguous boolean 'yes'\n"
        "help: write true or false\n"
        "\n"
        "x.yaml:2:5: E108 $.b[0]: ambiguous boolean 'no'\n"
        "help: write true or false\n"
        "\n"
        "x.yaml:2:9: E108 $.b[1]: ambiguous boolean 'On'\n"
        "help: write true or false\n"
        "\n"
        "x.yaml:3:1: E108 $: ambiguous boolean 'on'\n"
        "help: quote it if the key is the string 'on'\n"
        "\n"
        "4 errors"
    )


def test_leading_zero_numbers_are_ambiguous():
    # YAML 1.1 reads 010 as 8, YAML 1.2 as 10.
    assert yaml.safe_load("a: 010") == {"a": 8}
    assert rendered("a: 010\n") == ("x.yaml:1:4: E109 $.a: ambiguous number '010'\nhelp: YAML 1.1 reads a leading zero as octal: remove it, or quote the value")


def test_explicit_tags_are_rejected():
    assert rendered("a: !!str 5\nb: !model {x: 1}\n") == (
        "x.yaml:1:4: E110 $.a: tag '!!str' is not allowed\n"
        "help: remove the tag; quote the value if it must be a string\n"
        "\n"
        "x.yaml:2:4: E110 $.b: tag '!model' is not allowed\n"
        "help: remove the tag; quote the value if it must be a string\n"
        "\n"
        "2 errors"
    )


# --------------------------------------------------------------------------- all at once


def test_problems_of_different_kinds_are_collected_and_sorted():
    assert rendered("flag: off\nflag: true\nx: &a 1\n") == (
        "x.yaml:1:7: E108 $.flag: ambiguous boolean 'off'\n"
        "help: write true or false\n"
        "\n"
        "x.yaml:2:1: E103 $.flag: duplicate key 'flag'\n"
        "help: first defined at line 1\n"
        "\n"
        "x.yaml:3:4: E104 $.x: anchor '&a' is not allowed\n" + NO_ANCHORS + "\n"
        "\n"
        "3 errors"
    )


def test_a_2000_line_file_loads_quickly():
    lines = ["modules:"]
    for i in range(400):
        lines += [f"  m{i}:", "    kind: linear", f"    layers: {i}", "    hidden: 4_096", "    names: [q_proj, k_proj, v_proj]"]
    text = "\n".join(lines) + "\n"
    start = time.perf_counter()
    doc = load_yaml_text(text, "big.yaml")
    elapsed_ms = (time.perf_counter() - start) * 1000
    assert len(lines) == 2001
    assert doc.where("$.modules.m399.names[2]") == (2001, 29)
    print(f"2001 lines loaded in {elapsed_ms:.1f} ms")  # visible with pytest -s; ~25 ms with libyaml
