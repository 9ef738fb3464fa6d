"""Per-model folders: re-authored modules and their declarations (see DESIGN.md)."""
