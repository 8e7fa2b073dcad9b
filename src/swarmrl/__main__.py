from swarmrl.cli import main

raise SystemExit(main())
