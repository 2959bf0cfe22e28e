"""``python -m stage2_data.demo.hubserver FOLDER --repo-id R --revision REV [--port P]``."""

from .server import main

raise SystemExit(main())
