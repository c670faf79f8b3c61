#!/usr/bin/env python3
"""Tests of .ci/cycles.py's edge rules on small crates written to a
temporary directory. Run: python3 .ci/test_cycles.py"""

import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("cycles", os.path.join(HERE, "cycles.py"))
cycles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cycles)


def check(files):
    """(exit status, output) of the checker on a crate made of `files`
    ({path: text}, with src/lib.rs as its root)."""
    with tempfile.TemporaryDirectory() as d:
        for path, text in files.items():
            full = os.path.join(d, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = cycles.main([os.path.join(d, "src/lib.rs")])
        return status, out.getvalue().replace(d + os.sep, "")


class Rules(unittest.TestCase):
    def test_siblings_that_use_each_other_are_a_cycle(self):
        status, out = check({
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub(crate) struct A;\n",
            "src/b.rs": "pub(crate) struct B;\nfn f() { let _ = super::a::A; }\n",
        })
        self.assertEqual(status, 1)
        self.assertIn("src/a.rs -> src/b.rs", out)
        self.assertIn("src/b.rs -> src/a.rs", out)

    def test_a_parent_and_its_children_are_not(self):
        status, out = check({
            "src/lib.rs": "mod rt;\n",
            "src/rt/mod.rs": "mod build;\npub use build::Builder;\npub struct Rt;\n"
                             "fn f() { build::stop(); }\n",
            "src/rt/build.rs": "use super::Rt;\npub struct Builder;\npub fn stop() {}\n",
        })
        self.assertEqual((status, out), (0, ""))

    def test_paths_through_a_re_export_name_the_defining_file(self):
        status, out = check({
            "src/lib.rs": "mod error;\nmod other;\npub use error::Result;\n",
            "src/error.rs": "pub type Result = u8;\nfn f() { crate::other::g(); }\n",
            "src/other.rs": "pub fn g() -> crate::Result { 0 }\n",
        })
        self.assertEqual(status, 1)
        self.assertIn("src/other.rs -> src/error.rs", out)

    def test_a_module_imported_by_use_qualifies_paths(self):
        status, _ = check({
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b;\npub fn x() { b::y() }\n",
            "src/b.rs": "pub fn y() { crate::a::x() }\n",
        })
        self.assertEqual(status, 1)

    def test_comments_strings_and_test_modules_are_not_edges(self):
        status, out = check({
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "// crate::b::y\n/// [`crate::b::y`]\npub fn x() { let _ = \"crate::b::y\"; }\n"
                        "#[cfg(test)]\nmod tests {\n    use crate::b::y;\n}\n",
            "src/b.rs": "pub fn y() { crate::a::x() }\n",
        })
        self.assertEqual((status, out), (0, ""))

    def test_a_path_attribute_is_followed(self):
        status, _ = check({
            "src/lib.rs": "#[path = \"../shared/buf.rs\"]\nmod buf;\nmod a;\n",
            "shared/buf.rs": "pub fn b() { crate::a::a() }\n",
            "src/a.rs": "pub fn a() { crate::buf::b() }\n",
        })
        self.assertEqual(status, 1)


if __name__ == "__main__":
    unittest.main()
