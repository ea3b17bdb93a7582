def test_healthz_answers_ok_as_json(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok"}


def test_healthz_is_not_cached(client):
    response = client.get("/healthz")

    assert "no-cache" in response["Cache-Control"]


def test_healthz_refuses_writes(client):
    response = client.post("/healthz")

    assert response.status_code == 405
