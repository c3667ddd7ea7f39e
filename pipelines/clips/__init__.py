"""Event clips: the video around an alert, cut from each stream's encoded packets (issue 21)."""
