"""The query side: the `steprec.query.v1` and `steprec.admin.v1` services, and the SQL views and the
guards a stranger's query runs under."""
