"""The command line, ``streamdp`` (``python -m streamdp``): one module per group of subcommands.

:mod:`~streamdp.cli.app`
    The parser of every subcommand (its module docstring is the top-level ``--help``) and
    :func:`main`.
:mod:`~streamdp.cli.first_steps`
    ``simulate`` and ``demo``.
:mod:`~streamdp.cli.deployment`
    ``broker``, ``sketcher``, ``release``, ``produce``, ``control``.
:mod:`~streamdp.cli.inputs`
    ``vocab public``, ``vocab private``, ``public-start``.
:mod:`~streamdp.cli.readers`
    ``topics`` and ``report``.
:mod:`~streamdp.cli.common`
    What they share: argument types, the service flags, the configuration from the flags.
"""
from streamdp.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
