"""python -m engine generate | chat | bench | convert | estimate"""

from engine.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
