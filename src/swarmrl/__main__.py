from swarmrl.cli import main

if __name__ == "__main__":  # not when a spawned child process imports it
    raise SystemExit(main())
