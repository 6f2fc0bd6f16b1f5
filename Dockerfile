FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md beat_schedule.py ./
COPY src ./src
RUN pip install --no-cache-dir -c constraints.txt '.[all]'
CMD ["pal", "worker"]
