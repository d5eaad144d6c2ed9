from sailrl.cli import main

raise SystemExit(main())
