"""The recipe's pure parts, in the product's venv (no torch): sizes, the corpus split and hash, reST sections, and
the chat samples' agreement with the chat template the tokenizer ships."""

from __future__ import annotations

import jinja2

from harness.recipe import corpus, sizes, tok


def test_sizes_meet_the_issue():
    tiny, bench = sizes.get("tiny"), sizes.get("bench")
    for s in (tiny, bench):
        assert s.experts >= 32 and s.top_k >= 4 and s.layers >= 6
        p = s.params()
        assert p["total"] == sum(v for k, v in p.items() if k != "total")
    # tiny's Q4_K_M must stay under 24 MiB: even at Q8_0's 8.5 bits a weight it does
    assert tiny.params()["total"] * 8.5 / 8 < 24 * 2**20


def test_unknown_size_is_refused():
    try:
        sizes.get("huge")
    except KeyError as e:
        assert "tiny" in e.args[0]
    else:
        raise AssertionError("an unknown size passed")


def _files(n: int) -> list[corpus.CorpusFile]:
    rels = [f"usr/lib/python3.11/mod{i}.py" for i in range(n)]
    return [corpus.CorpusFile(r, f"{i:064x}", 10, corpus.is_heldout(r)) for i, r in enumerate(rels)]


def test_split_is_by_name_and_about_five_percent():
    files = _files(4000)
    train, held = corpus.split(files)
    assert len(train) + len(held) == 4000
    assert 0.03 < len(held) / 4000 < 0.07
    assert not {f.rel for f in train} & {f.rel for f in held}
    again = corpus.split(list(reversed(files)))
    assert {f.rel for f in again[1]} == {f.rel for f in held}  # order does not matter, names do


def test_corpus_hash_covers_contents_and_versions():
    files = _files(10)
    v = {"python3.11-doc": "3.11.2-6+deb12u8"}
    h = corpus.corpus_hash(files, v)
    assert h == corpus.corpus_hash(list(reversed(files)), v)
    changed = [corpus.CorpusFile(files[0].rel, "f" * 64, 10, files[0].heldout), *files[1:]]
    assert corpus.corpus_hash(changed, v) != h
    assert corpus.corpus_hash(files, {"python3.11-doc": "3.11.2-6+deb12u9"}) != h


def test_sections_from_headings_and_directives():
    text = (":mod:`os.path` --- Common pathname manipulations\n"
            "================================================\n\n"
            + "This module implements some useful functions on pathnames. " * 3 + "\n\n"
            ".. function:: basename(path)\n\n"
            "   Return the base name of pathname *path*.  This is the second element of the\n"
            "   pair returned by passing *path* to the function split.\n\n"
            "   .. versionchanged:: 3.6\n\n"
            "Next paragraph outside.\n")
    got = dict(corpus.sections(text))
    assert "os.path --- Common pathname manipulations" in got
    assert got["basename(path)"].startswith("Return the base name of pathname *path*.")
    assert "Next paragraph outside" not in got["basename(path)"]


def test_chat_samples_are_the_templates_own_rendering():
    rendered = jinja2.Environment().from_string(tok.CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": "basename(path)"}, {"role": "assistant", "content": "Return it."}],
        add_generation_prompt=False)
    assert rendered == tok.chat_text("basename(path)", "Return it.")
