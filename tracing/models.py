"""Models of this app arrive with their issue; the app is installed now so URLs and
migrations have a stable home."""
