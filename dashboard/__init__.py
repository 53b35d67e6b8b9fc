"""Dashboard: the Streamlit app; pages render what ``analytics`` returns and hold no SQL.
May import ``analytics`` and ``storage``.
"""
