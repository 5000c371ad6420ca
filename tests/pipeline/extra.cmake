# The swimlane tests read the SVG they write back with libxml2 (a real XML parser, so a
# picture that is not well-formed fails).
if(TARGET test_pipeline)
  meshtrain_require(LibXml2 "libxml2-dev")
  target_link_libraries(test_pipeline PRIVATE LibXml2::LibXml2)
endif()
