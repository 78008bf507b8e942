"""Streamlit app over run directories (see the UI issue)."""
