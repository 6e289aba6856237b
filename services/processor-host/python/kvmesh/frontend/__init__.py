"""Namespace of the frontend's extension points (`dynamo.frontend` when Dynamo is not installed)."""
