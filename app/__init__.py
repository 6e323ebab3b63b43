"""The rcdiag Streamlit dashboard (entry: app/dashboard.py; started by `rcdiag dashboard RUN`)."""
