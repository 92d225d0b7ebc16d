// Package faultproxy is an HTTP reverse proxy that breaks chosen requests to
// a CreateOS-compatible server the way networks and servers really break:
// lost responses, statuses, stalls, cut or corrupted output streams.
//
//	proxy, _ := faultproxy.New(serverURL, seed)
//	proxy.AddRule(faultproxy.Rule{Name: "lost create", Method: "POST", Path: "/sandboxes", Fault: faultproxy.DropResponse()})
//	client := createos.New(proxy.URL(), …)
//
// Tests of sandboxflow and of your own workflows use it; so do the devserver
// stack's chaos soak and fleet.
package faultproxy
