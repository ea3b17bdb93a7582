"""No models: search reads the chat app's tables through the database's full-text indexes
(migrations/0001_fts_indexes.py). The module exists so that Django sends this app post_migrate
(it skips apps without one), where apps.py re-creates triggers a chat migration dropped."""
