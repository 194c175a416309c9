from speakd.cli import main

raise SystemExit(main())
