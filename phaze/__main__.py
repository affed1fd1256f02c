from phaze.cli import main

raise SystemExit(main())
