package temporalserver

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/temporalio/ui-server/v2/server/api"
	"github.com/temporalio/ui-server/v2/server/auth"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	"github.com/temporalio/ui-server/v2/server/cors"
	"github.com/temporalio/ui-server/v2/server/csrf"
	"github.com/temporalio/ui-server/v2/server/headers"
	"github.com/temporalio/ui-server/v2/server/route"
	uiassets "github.com/temporalio/ui-server/v2/ui"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
)

// webUI serves the Temporal Web UI (its assets are compiled into
// ui-server) and its HTTP API, a proxy to the frontend's gRPC API.
//
// It assembles the same echo routes and middleware as ui-server's
// server.NewServer (v2.54.1) rather than using that Server, because that
// Server binds its own listener inside a blocking Start that calls
// os.Exit when the port is taken, and never closes its gRPC connection.
// Here the listener is bound before anything else happens (a taken port is
// a clean error, and the UI answers as soon as Start returns) and Stop
// releases both the port and the connection.
type webUI struct {
	srv    *http.Server
	conn   *grpc.ClientConn
	served chan error // receives Serve's result
}

// startWebUI serves the UI on ln. With a codecEndpoint, the UI decodes the
// payloads it shows through that codec server, from the browser: no access
// token is passed (the dev UI has no login) and no cookies are sent.
func startWebUI(ln net.Listener, frontendHostPort, namespace, codecEndpoint string) (*webUI, error) {
	cfg := &uiconfig.Config{
		TemporalGRPCAddress: frontendHostPort,
		EnableUI:            true,
		DefaultNamespace:    namespace,
		// Plain HTTP on a local address: a Secure cookie would never be sent back.
		CORS:             uiconfig.CORS{CookieInsecure: true},
		DisableNewsFetch: true, // no calls to the internet
	}
	cfg.Codec.Endpoint = codecEndpoint
	cfgProvider, err := uiconfig.NewConfigProviderWithRefresh(cfg)
	if err != nil {
		return nil, fmt.Errorf("temporalserver: UI config: %w", err)
	}
	conn, err := api.CreateGRPCConnection(cfgProvider)
	if err == nil && conn == nil {
		err = errors.New("dial failed") // reported so, as a nil connection
	}
	if err != nil {
		return nil, fmt.Errorf("temporalserver: UI: connect to frontend %s: %w", frontendHostPort, err)
	}
	e, err := uiRoutes(cfgProvider, conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	ui := &webUI{
		srv:    &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second},
		conn:   conn,
		served: make(chan error, 1),
	}
	go func() { ui.served <- ui.srv.Serve(ln) }()
	return ui, nil
}

// uiRoutes mirrors server.NewServer and route.SetAPIRoutes of ui-server.
func uiRoutes(cfgProvider *uiconfig.ConfigProviderWithRefresh, conn *grpc.ClientConn) (*echo.Echo, error) {
	const cookieSecure = false // see CookieInsecure above
	e := echo.New()
	e.Use(middleware.Recover())
	e.Use(middleware.Gzip())
	e.Use(cors.CORSMiddleware(cors.CORSConfig{
		AllowHeaders: []string{
			echo.HeaderOrigin, echo.HeaderContentType, echo.HeaderAccept,
			echo.HeaderXCSRFToken, echo.HeaderAuthorization, auth.AuthorizationExtrasHeader,
			"Caller-Type",
		},
		AllowCredentials: true,
		ConfigProvider:   cfgProvider,
	}))
	e.Use(middleware.Secure())
	e.Use(csrf.EnsureTokenCookie(cookieSecure))
	e.Use(middleware.CSRFWithConfig(csrf.MiddlewareConfig(cfgProvider, cookieSecure)))

	route.SetHealthRoute(e)

	apiMiddleware := []api.Middleware{
		headers.WithForwardHeaders([]string{auth.AuthorizationExtrasHeader, "Caller-Type"}),
	}
	writeControl := route.DisableWriteMiddleware(cfgProvider)
	apiGroup := e.Group("/api/v1")
	apiGroup.GET("/settings", api.GetSettings(cfgProvider))
	apiGroup.GET(api.WorkflowRawHistoryUrl,
		api.WorkflowRawHistoryHandler(workflowservice.NewWorkflowServiceClient(conn)), writeControl)
	apiGroup.Match([]string{"GET", "POST", "PUT", "PATCH", "DELETE"}, "/*",
		api.TemporalAPIHandler(cfgProvider, apiMiddleware, conn), writeControl)
	route.SetAuthRoutes(e, cfgProvider)

	assets, err := uiassets.Assets()
	if err == nil {
		assets, err = fs.Sub(assets, "local")
	}
	if err == nil {
		err = route.SetUIRoutes(e, "", assets)
	}
	if err != nil {
		return nil, fmt.Errorf("temporalserver: UI assets: %w", err)
	}
	route.SetRenderRoute(e, "")
	return e, nil
}

// stop closes the listener and every connection, then the gRPC connection.
func (ui *webUI) stop() error {
	err := ui.srv.Close()
	if served := <-ui.served; !errors.Is(served, http.ErrServerClosed) {
		err = errors.Join(err, served)
	}
	return errors.Join(err, ui.conn.Close())
}
