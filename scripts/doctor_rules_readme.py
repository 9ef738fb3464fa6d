"""Regenerate README.md's doctor rule table from zoo.doctor's rule registry (tests/test_doctor.py checks it).

    .venv/bin/python scripts/doctor_rules_readme.py
"""

from pathlib import Path

from zoo.doctor import README_BEGIN, README_END, rules_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    head, _, rest = text.partition(README_BEGIN)
    _, _, tail = rest.partition(README_END)
    README.write_text(f"{head}{README_BEGIN}\n{rules_markdown()}\n{README_END}{tail}")


if __name__ == "__main__":
    main()
