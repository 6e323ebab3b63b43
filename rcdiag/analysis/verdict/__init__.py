"""The verdict: health bands, causes and their precedence, the one verdict every surface shows."""
