FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md beat_schedule.py ./
COPY src ./src
RUN pip install --no-cache-dir .
CMD ["pal", "worker"]
