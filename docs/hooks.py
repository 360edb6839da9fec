"""A hook of the documentation site (mkdocs.yml): the package's docstrings
name other objects with Sphinx roles (:class:`SharedTensor`), which
mkdocstrings renders as the role's text before a code span; the page shows
the code span alone."""

import re

ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj):(?=<code>)")


def on_page_content(html, page, config, files):
    return ROLE.sub("", html)
