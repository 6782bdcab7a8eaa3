"""``python -m streamdp``: the command line (see ``streamdp.cli``)."""
from streamdp.cli import main

raise SystemExit(main())
