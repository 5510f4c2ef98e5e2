from mhalearn.cli import main

raise SystemExit(main())
