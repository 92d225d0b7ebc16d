# sandboxflow — the commands a newcomer needs are `make run` and `make test`.
GO ?= go

.PHONY: test vet
test: vet
	$(GO) test -race ./...

vet:
	$(GO) vet ./...
