"""``python -m stage2_data.demo OUT [--full-cardinality]``."""

from .generator import main

raise SystemExit(main())
