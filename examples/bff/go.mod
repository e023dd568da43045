module github.com/idemgo/idem/examples/bff

go 1.25.0

require (
	github.com/idemgo/idem v0.0.0
	github.com/idemgo/idem/idemriver v0.0.0
	github.com/idemgo/idem/pgstore v0.0.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/riverqueue/river v0.44.1
	github.com/riverqueue/river/riverdriver/riverpgxv5 v0.44.1
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/riverqueue/river/riverdriver v0.44.1 // indirect
	github.com/riverqueue/river/rivershared v0.44.1 // indirect
	github.com/riverqueue/river/rivertype v0.44.1 // indirect
	github.com/tidwall/gjson v1.19.0 // indirect
	github.com/tidwall/match v1.2.0 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/idemgo/idem => ../..
	github.com/idemgo/idem/idemriver => ../../idemriver
	github.com/idemgo/idem/pgstore => ../../pgstore
)
